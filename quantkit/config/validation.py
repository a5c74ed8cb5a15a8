"""One validation mechanism for every config: pydantic v2, strict types, unknown keys refused.

``@config`` turns a class into a frozen pydantic dataclass (so ``dataclasses.replace``,
``asdict`` and ``fields`` keep working) whose constructor raises ``QuantkitError``. Its
fields use pydantic's strict types (``StrictInt`` refuses ``4.0`` and ``true``,
``StrictBool`` refuses ``"false"``); checks across fields are ``model_validator``\\ s that
raise ``invalid(message, key)``. ``parse(cls, data, where)`` validates a mapping read from a
file; ``build_options(cls, options, where)`` checks a step's options against the typed
fields of its plain dataclass and builds it. Every failure is one line naming the key path:

    >>> from quantkit.config.scheme import QuantArgs
    >>> parse(QuantArgs, {"num_bits": 4.0}, "config_groups.g.weights")
    Traceback (most recent call last):
    quantkit.errors.QuantkitError: config_groups.g.weights.num_bits: expected an integer, got 4.0
"""

from __future__ import annotations

import dataclasses
import functools
import json
import reprlib
import types
import typing
from typing import Any, Annotated, Mapping, TypeVar, Union, get_args, get_origin

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import PydanticCustomError
from typing_extensions import Required, TypedDict

from quantkit.errors import QuantkitError

T = TypeVar("T")

# Fields name their strict types themselves (a strict dataclass would refuse a mapping as
# input, and a recipe is nested mappings); unknown keys are refused everywhere.
CONFIG = ConfigDict(extra="forbid")
_OPTIONS_CONFIG = ConfigDict(strict=True, extra="forbid")


def config(cls: type[T]) -> type[T]:
    """Class decorator: a frozen, validated pydantic dataclass that raises ``QuantkitError``."""
    cls = pydantic_dataclass(frozen=True, config=CONFIG)(cls)
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except ValidationError as e:
            raise QuantkitError(error_line(e, root=cls)) from None

    cls.__init__ = __init__
    return cls


def invalid(message: str, key: str | None = None) -> PydanticCustomError:
    """The error a cross-field check raises; ``key`` (``"weights.num_bits"``) extends the path."""
    return PydanticCustomError("quantkit", "{message}", {"message": message, "key": key})


def parse(cls: type[T], data: Any, where: str = "") -> T:
    """``data`` (a mapping from a file) validated as ``cls``, or a one-line ``QuantkitError``."""
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as e:
        raise QuantkitError(error_line(e, where, root=cls)) from None


def check_flag(cls: type, key: str, value: Any, flag: str) -> Any:
    """A command-line ``flag`` that stands for field ``key`` of ``cls``, checked as that field is.

    >>> from quantkit.evaluation.eval_section import EvalSection
    >>> check_flag(EvalSection, "max_len", 0, "--max-len")
    Traceback (most recent call last):
    quantkit.errors.QuantkitError: --max-len: must be >= 16, got 0
    """
    return parse(typing.get_type_hints(cls, include_extras=True)[key], value, flag)


def build_options(cls: type[T], options: Mapping[str, Any] | None, where: str) -> T:
    """An instance of the plain dataclass ``cls`` from recipe options, checked strictly.

    Types come from the field annotations (floats accept integers; integers refuse floats
    and booleans; booleans refuse strings); unknown keys are refused by name. The class's own
    ``__post_init__`` checks run next and are reported under ``where`` too.
    """
    values = checked_options(cls, options, where)
    try:
        return cls(**values)
    except QuantkitError as e:
        raise QuantkitError(f"{where}.{e}") from None
    except (TypeError, ValueError) as e:
        raise QuantkitError(f"{where}: {e}") from None


def checked_options(cls: type, options: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """The options given for ``cls`` (a plain dataclass), validated, as plain values."""
    if options is None:
        return {}
    model = options_schema(cls)
    try:
        return dict(_adapter(model).validate_python(options))
    except ValidationError as e:
        raise QuantkitError(error_line(e, where, root=model)) from None


@functools.cache
def options_schema(cls: type) -> type:
    """A strict ``TypedDict`` of ``cls``'s init fields: validates only the keys given."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields[f.name] = Required[hints[f.name]] if required else hints[f.name]
    schema = TypedDict(f"{cls.__name__}Options", fields, total=False)
    schema.__pydantic_config__ = _OPTIONS_CONFIG
    return schema


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def json_object(text: str, where: str) -> dict:
    """``text`` read as one JSON object (a config file, a JSONL line), or one line naming ``where``.

    >>> json_object("[1]", "x.jsonl:3")
    Traceback (most recent call last):
    quantkit.errors.QuantkitError: x.jsonl:3: expected a JSON object, got list
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise QuantkitError(f"{where}: not JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise QuantkitError(f"{where}: expected a JSON object, got {type(data).__name__}")
    return data


# -- the one line ----------------------------------------------------------------------------
def error_line(err: ValidationError, where: str = "", root: type | None = None) -> str:
    """The first error as ``"<where><key.path>: <what is wrong>"``.

    >>> from quantkit.config.scheme import QuantScheme
    >>> try:
    ...     TypeAdapter(QuantScheme).validate_python({"weights": {"num_bits": 4.0}})
    ... except ValidationError as err:
    ...     e = err
    >>> error_line(e, "config_groups.g")        # e: num_bits 4.0 in weights
    'config_groups.g.weights.num_bits: expected an integer, got 4.0'
    """
    e = err.errors(include_url=False)[0]
    parts = list(e["loc"])
    # "[key]" follows a mapping key that failed: a key, even when an integer, not an index
    loc = [str(p) if parts[i + 1:i + 2] == ["[key]"] else p for i, p in enumerate(parts) if p != "[key]"]
    ctx = e.get("ctx") or {}
    kind = e["type"]
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        key = loc.pop()
        allowed = _allowed_keys(root, loc)
        message = f"unknown key '{short_text(key)}'" + (f" (allowed: {', '.join(allowed) or 'none'})" if allowed is not None else "")
    else:
        if kind == "quantkit" and ctx.get("key"):
            loc += ctx["key"].split(".")
        message = _message(kind, e.get("input"), ctx, e["msg"])
    path = join_path(where, loc)
    return f"{path}: {message}" if path else message


def join_path(where: str, loc: list) -> str:
    """``join_path("steps", [1, "gptq"]) == "steps[1].gptq"``."""
    out = where
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            part = short_text(part)   # a key from the file: quoted only as a prefix
            out = f"{out}.{part}" if out else part
    return out


def _message(kind: str, got: Any, ctx: dict, default: str) -> str:
    if kind == "quantkit":
        return ctx["message"]
    if kind.startswith("int_"):
        return f"expected an integer, got {_show(got)}"
    if kind.startswith("bool_"):
        return f"expected true or false, got {_show(got)}"
    if kind.startswith("float_"):
        return f"expected a number, got {_show(got)}"
    if kind.startswith("string_"):
        return f"expected a string, got {_show(got)}"
    if kind in ("dict_type", "dataclass_type", "model_type", "mapping_type", "dataclass_exact_type"):
        return f"expected a mapping, got {_kind(got)}"
    if kind in ("list_type", "tuple_type", "iterable_type"):
        return f"expected a list, got {_kind(got)}"
    if kind == "literal_error":
        return f"must be {ctx['expected']}, got {_show(got)}"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return f"must be {bounds[kind]} {limit}, got {_show(got)}"
    if kind == "too_short":
        return "must not be empty"
    if kind in ("missing", "missing_argument"):
        return "required key missing"
    return f"{default[:1].lower()}{default[1:]}, got {_show(got)}"


#: Characters of a user's value an error line quotes at most (``short``).
SHORT_CHARS = 60


def _short_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    # strings are cut before repr() sees them, containers after a few items and two levels:
    # rendering never costs more than the quoted prefix, however large the value
    r.maxstring = r.maxother = r.maxlong = SHORT_CHARS
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = 4
    r.maxlevel = 2
    return r


_REPR = _short_repr()


def short(value: Any) -> str:
    """``repr(value)`` cut to at most about ``SHORT_CHARS`` characters, rendered from a prefix of
    the value only (an alias-expanded or megabyte-long value costs no more than a short one).

    >>> short("x" * 10**6)[:10], len(short("x" * 10**6)) <= SHORT_CHARS + 3
    ("'xxxxxxxxx", True)
    """
    try:
        text = _REPR.repr(value)
    except ValueError:   # an integer past Python's digit limit for str()
        text = f"<{type(value).__name__}>"
    return text if len(text) <= SHORT_CHARS + 3 else text[:SHORT_CHARS] + "..."


def short_text(value: Any) -> str:
    """``str(value)`` of a name the user gave (a key, a step), cut to ``SHORT_CHARS`` characters."""
    if not isinstance(value, str):
        return short(value)
    return value if len(value) <= SHORT_CHARS else value[:SHORT_CHARS] + "..."


def _show(value: Any) -> str:
    return short(value)


def _kind(value: Any) -> str:
    return {list: "a list", tuple: "a list", str: f"the string {_show(value)}", type(None): "nothing"}.get(
        type(value), type(value).__name__)


def _allowed_keys(root: type | None, loc: list) -> list[str] | None:
    """The keys of the mapping at ``loc`` under ``root``, when its schema is known."""
    t: Any = root
    for part in loc:
        t = _child(t, part)
        if t is None:
            return None
    names = _field_names(_unwrap(t))
    return sorted(names) if names is not None else None


def _unwrap(t: Any) -> Any:
    """``X`` from ``Annotated[X, ...]``, ``X | None``, ``Required[X]``."""
    while True:
        origin = get_origin(t)
        if origin is Annotated or origin is Required:
            t = get_args(t)[0]
        elif origin in (Union, types.UnionType):
            rest = [a for a in get_args(t) if a is not type(None)]
            if len(rest) != 1:
                return t
            t = rest[0]
        else:
            return t


def _field_names(t: Any) -> list[str] | None:
    if hasattr(t, "__pydantic_fields__"):
        return [n for n, f in t.__pydantic_fields__.items() if f.init is not False]
    if isinstance(t, type) and issubclass(t, dict) and hasattr(t, "__required_keys__"):  # a TypedDict
        return list(t.__annotations__)
    return None


def _child(t: Any, part: Any) -> Any:
    t = _unwrap(t)
    fields = getattr(t, "__pydantic_fields__", None)
    if fields is not None:
        return fields[part].annotation if part in fields else None
    if _field_names(t) is not None:  # a TypedDict
        return typing.get_type_hints(t, include_extras=True).get(part)
    origin, args = get_origin(t), get_args(t)
    if origin in (dict, Mapping) and len(args) == 2:
        return args[1]
    if origin in (list, tuple) and args:
        return args[0]
    return None
