"""``quantkit convert``'s whole job as one call, for the command line and a Python caller alike:
the recipe with the request's overrides, the output folder prepared, the conversion (model-free,
on torchrun ranks, or the smallest-GO search), the checkpoint saved, evaluated, and its model
card written again with the verdict. Nothing here prints: lines go to ``say``.

Example:
    >>> from quantkit.workflows.convert_checkpoint import ConvertRequest, convert_checkpoint
    >>> done = convert_checkpoint(ConvertRequest(recipe="w8a16", out=Path("out/w8")))  # doctest: +SKIP
    >>> done.decision                                                                  # doctest: +SKIP
    'GO'
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from quantkit.common import distributed
from quantkit.common.outputs import OutputPolicy
from quantkit.errors import QuantkitError
from quantkit.evaluation.eval_section import check_eval_section
from quantkit.formats.writer import prepare_output
from quantkit.recipe import load_recipe
from quantkit.workflows import convert as api
from quantkit.workflows.torchrun import relaunch_on_ranks
from quantkit.workflows.model_card import check_lang, write_card
from quantkit.workflows.model_free import ModelFreeOptions, convert_model_free
from quantkit.workflows.model_free_choice import ASKED, check_flags, model_free_reason
from quantkit.workflows.smallest_go import RESULT_FILE, smallest_go

EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_TEXT = "embedded default (SmolLM2-135M-Instruct)"


@dataclass(frozen=True)
class ConvertRequest:
    """What ``quantkit convert`` is asked (each field is the flag of its name; ``evaluate``:
    not ``--no-eval``)."""

    model: str | None = None
    recipe: str = "w4a16-g64"
    out: Path | None = None
    calib: str | None = None
    group_size: int | None = None
    ignore: tuple[str, ...] = ()
    num_samples: int | None = None
    max_seq_len: int | None = None
    overwrite: bool = False
    resume: bool = False
    device: str = "cpu"
    budget: str | None = None          # bits per weight, or "go"
    sensitivity: str | None = None
    evaluate: bool = True
    trust_remote_code: bool = False
    nproc: str | None = None
    lang: str = "en"
    model_free: bool = False
    targets: str | None = None

    @property
    def smallest_go(self) -> bool:
        return self.budget is not None and self.budget.strip().lower() == "go"


@dataclass(frozen=True)
class Reporters:
    """Where a conversion reports: the layer loop's progress (None: none) and its log lines."""

    progress: Callable | None = None
    say: Callable[[str], None] = print


@dataclass
class ConvertOutcome:
    """What a conversion left: the checkpoint (None on a rank that does not write), its summary,
    its evaluation, the smallest-GO search, or the exit status of the ranks it launched."""

    path: Path | None = None
    summary: dict | None = None
    evaluation: object | None = None        # workflows.evaluate.Evaluated
    search: object | None = None            # workflows.smallest_go.GoSearch
    launched_exit: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def decision(self) -> str | None:
        """The verdict on the checkpoint written (None: not evaluated)."""
        return None if self.evaluation is None else self.evaluation.result.decision


def convert_checkpoint(request: ConvertRequest, report: Reporters | None = None) -> ConvertOutcome:
    """Check the request and the recipe, prepare the output, convert (or search the smallest GO
    plan), save, evaluate, and write the card with the verdict."""
    # the request and the recipe are checked before the pipeline's modules (transformers) load:
    # a refused command answers in about the time Python takes to import torch

    report = report or Reporters()
    check_lang(request.lang)
    ranks = distributed.parse_nproc(request.nproc, request.device)
    launched = distributed.launched_ranks()
    if ranks is not None and launched > 1 and ranks != launched:
        raise QuantkitError(f"--nproc: {ranks}, but torchrun started {launched} ranks; give one or the other")
    r = convert_recipe(request)
    out = output_folder(request, r.name)
    device = distributed.initialize(request.device)   # joins torchrun's process group, if it started this one
    writes = distributed.is_writer()
    inputs = api.conversion_inputs(request.model, r, request.recipe, request.calib)
    free = model_free_reason(request.model, r, request.model_free, request.trust_remote_code)
    if writes:
        prepare_output(out, request.overwrite, OutputPolicy("convert", inputs))
    if free is not None:
        return _convert_model_free(request, r, out, inputs, free, report)
    if ranks is not None and ranks > 1 and launched == 1:
        # the ranks check and convert again; this process only waits
        return ConvertOutcome(launched_exit=relaunch_on_ranks(ranks, command_args(request), out))
    say = report.say if writes else (lambda line: None)
    # a rank other than 0 computes with rank 0 and says nothing
    progress = _announced(report.progress, say, f"quantkit convert: {request.model or EMBEDDED_TEXT} -> {out} "
                          f"[recipe {r.name}, steps {_steps(r)}]") if writes else None
    if r.mixed is not None and r.mixed.smallest_go is not None:   # --budget go, or the recipe's key
        return _smallest_go(request, r, out, device, Reporters(progress, say), writes)
    options = api.ConvertOptions(list(request.ignore), out.parent, out, request.resume, device, progress, say,
                                 request.trust_remote_code, request.lang)
    q = api.convert(request.model, r, request.calib, options, inputs)
    if not writes:
        return ConvertOutcome()
    path = q.save(out, overwrite=request.overwrite)
    done = ConvertOutcome(path, q.summary())
    if request.evaluate:
        done.evaluation = evaluate_written(request, path, r, say)
    return done


def _announced(progress: Callable | None, say: Callable[[str], None], banner: str) -> Callable | None:
    """``progress`` after a ``banner`` line: said once the model, recipe and data are checked, so a
    bad input's output is its error line alone."""
    if progress is None:
        return None

    def announced(iterable, total):
        say(banner)
        return progress(iterable, total)
    return announced


def _steps(recipe) -> str:
    return " -> ".join(st.name for st in recipe.steps)


def convert_recipe(request: ConvertRequest):
    """The recipe with the request's overrides; every key, the eval: section included, checked."""

    go = request.smallest_go
    return load_recipe(request.recipe, check_eval=check_eval_section).with_overrides(
        request.group_size, None, request.num_samples, request.max_seq_len, request.calib,
        budget_bits=None if go else budget_bits(request.budget), sensitivity=request.sensitivity, smallest_go=go)


def budget_bits(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise QuantkitError(f"--budget: expected bits per weight (e.g. 4.5) or 'go', got {text!r}") from None


def output_folder(request: ConvertRequest, recipe_name: str) -> Path:
    """``--out``, else ``out/<model>-<recipe>``."""
    model_name = Path(request.model).name if request.model else EMBEDDED_NAME
    return request.out or Path("out") / f"{model_name}-{recipe_name}"


def evaluate_written(request: ConvertRequest, path: Path, recipe, say: Callable[[str], None]):
    """The evaluation of a checkpoint this conversion wrote (report in ``path/eval``, in the card's
    language), then the card rendered again with its verdict."""

    from quantkit.workflows import evaluate   # transformers: loaded once the conversion is done

    evaluated = evaluate.evaluate_checkpoint(request.model, path, recipe, request.calib, request.lang, say)
    write_card(path, lang=request.lang)
    return evaluated


def _convert_model_free(request: ConvertRequest, r, out: Path, inputs: dict, reason: str,
                        report: Reporters) -> ConvertOutcome:
    """``model_free`` (or a folder transformers cannot build): the shards quantized tensor by
    tensor; no evaluation, which would build the model this path avoids."""

    check_flags({"--resume": request.resume, "--nproc": request.nproc is not None,
                 "--sensitivity": request.sensitivity is not None, "--device": request.device != "cpu"})
    say = report.say
    if reason != ASKED:
        say(f"model-free: {reason}; the shards are quantized tensor by tensor instead (--model-free)")
    if request.calib is not None:
        say(f"warning: --calib: a model-free conversion takes no calibration data (recipe '{r.name}'); not used")
    banner = f"quantkit convert: {request.model or EMBEDDED_TEXT} -> {out} [recipe {r.name}, steps {_steps(r)}]"
    options = ModelFreeOptions(request.targets, list(request.ignore), out.parent, out,
                               _announced(report.progress, say, banner), say, request.lang)
    q = convert_model_free(request.model, r, options, inputs)
    path = q.save(out, overwrite=request.overwrite)
    done = ConvertOutcome(path, q.summary())
    if request.evaluate:
        done.notes.append(f"evaluation skipped: it builds the model a model-free conversion avoids "
                          f"(run quantkit eval {path})")
    return done


def _smallest_go(request: ConvertRequest, r, out: Path, device: str, report: Reporters,
                 writes: bool) -> ConvertOutcome:
    """``--budget go``: plans converted and evaluated until the smallest GO is found
    (smallest_go.py); each plan's verdict is the evaluation's value, not read back from a file."""
    if not request.evaluate:
        raise QuantkitError("--budget go: needs the evaluation (it decides which plan is GO); drop --no-eval")
    if request.resume:
        raise QuantkitError("--budget go: --resume continues one conversion, not a search; drop --resume")
    evaluations: dict[Path, object] = {}

    def verdict(folder: Path) -> str:
        from quantkit.workflows import evaluate   # transformers: loaded once the conversion is done

        evaluations[Path(folder)] = evaluate.evaluate_checkpoint(request.model, folder, r, request.calib,
                                                                 request.lang, report.say)
        return evaluations[Path(folder)].result.decision

    options = api.ConvertOptions(ignore=list(request.ignore), device=device, progress=report.progress,
                                 trust_remote_code=request.trust_remote_code, lang=request.lang)
    q, search = smallest_go(request.model, r, request.calib, evaluate=verdict, workdir=out.parent, log=report.say,
                            options=options)
    if search.found is None:
        report.say(f"smallest GO: no plan up to {search.high_bits:.3f} bits per weight is GO; writing the "
                   f"{search.high_bits:.3f}-bit plan ({search.trials[0].decision}) and its report ({RESULT_FILE})")
    if not writes:
        return ConvertOutcome(search=search)
    evaluated = evaluations[Path(q.path)]
    path = q.save(out, overwrite=request.overwrite)
    write_card(path, lang=request.lang)   # the search evaluated the plan it kept
    return ConvertOutcome(path, q.summary(), replace(evaluated, folder=path / "eval"), search)


def command_args(request: ConvertRequest) -> list[str]:
    """``request`` as ``quantkit convert``'s arguments: what each torchrun rank runs."""
    args = ["convert", *([request.model] if request.model else []), "--recipe", request.recipe]
    valued = {"--out": request.out, "--calib": request.calib, "--group-size": request.group_size,
              "--num-samples": request.num_samples, "--max-seq-len": request.max_seq_len,
              "--device": request.device, "--budget": request.budget, "--sensitivity": request.sensitivity,
              "--lang": request.lang, "--targets": request.targets}
    for flag, value in valued.items():
        if value is not None:
            args += [flag, str(value)]
    for name in request.ignore:
        args += ["--ignore", name]
    switches = {"--overwrite": request.overwrite, "--resume": request.resume, "--no-eval": not request.evaluate,
                "--trust-remote-code": request.trust_remote_code, "--model-free": request.model_free}
    return args + [flag for flag, on in switches.items() if on]
