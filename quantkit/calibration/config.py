"""Sampler configuration: a validated, versioned value object.

Unknown keys are rejected by name so a typo in a recipe or on the command line never
silently falls back to a default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from quantkit.calibration.allocate import POLICIES
from quantkit.errors import QuantkitError

CONFIG_VERSION = 1

#: Length-bucket upper edges in tokens. Buckets are (0, 64], (64, 128], ... and the last
#: bucket always ends at ``max_len``; edges at or above ``max_len`` are dropped.
# Bounds no calibration set needs to pass: the longest contexts served today are about a million
# tokens, and GPTQ/AWQ statistics settle within a few thousand samples. Past them a typo (an extra
# digit, a byte count) would only grow memory until the kernel stops the run.
MAX_LEN_LIMIT = 1 << 20
NUM_SAMPLES_LIMIT = 100_000

DEFAULT_LENGTH_EDGES: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

LONG_POLICIES = ("truncate", "drop")


@dataclass(frozen=True)
class FieldMap:
    """Which keys of a log row hold what. A row is read as the first shape whose key is present:
    chat (``messages``), then prompt/completion, then raw ``text``."""

    messages: str = "messages"
    prompt: str = "prompt"
    completion: str = "completion"
    text: str = "text"
    task: str | None = "task"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "task" and value is None:
                continue
            if not isinstance(value, str) or not value:
                raise QuantkitError(f"fields.{f.name}: expected a non-empty column name, got {value!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FieldMap":
        _reject_unknown(data, cls, "fields")
        return cls(**data)


@dataclass(frozen=True)
class SamplerConfig:
    """How to draw a calibration set.

    Example:
        >>> cfg = SamplerConfig(num_samples=256, max_len=2048, seed=1)
        >>> cfg.bucket_edges()[-1]
        2048
    """

    num_samples: int = 512
    max_len: int = 2048
    seed: int = 0
    policy: str = "traffic"            # allocate.py: traffic, sqrt or balanced
    min_per_cell: int = 2
    length_edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES
    long_policy: str = "truncate"
    near_dup_threshold: float = 0.8
    max_malformed_share: float = 0.05
    warn_below_rows: int = 10
    fields: FieldMap = field(default_factory=FieldMap)

    def __post_init__(self) -> None:
        if not isinstance(self.fields, FieldMap):
            object.__setattr__(self, "fields", FieldMap.from_dict(dict(self.fields)))
        object.__setattr__(self, "length_edges", tuple(int(e) for e in self.length_edges))
        _check(1 <= self.num_samples <= NUM_SAMPLES_LIMIT, "num_samples (--n)",
               f"must be between 1 and {NUM_SAMPLES_LIMIT}, got {self.num_samples}")
        _check(2 <= self.max_len <= MAX_LEN_LIMIT, "max_len (--max-len)",
               f"must be between 2 and {MAX_LEN_LIMIT} tokens, got {self.max_len}")
        _check(self.policy in POLICIES, "policy", f"must be one of {', '.join(POLICIES)}")
        _check(self.long_policy in LONG_POLICIES, "long_policy", f"must be one of {', '.join(LONG_POLICIES)}")
        _check(self.min_per_cell >= 0, "min_per_cell", "must be >= 0")
        _check(0.0 < self.near_dup_threshold <= 1.0, "near_dup_threshold", "must be in (0, 1]")
        _check(0.0 <= self.max_malformed_share <= 1.0, "max_malformed_share", "must be in [0, 1]")
        _check(self.warn_below_rows >= 0, "warn_below_rows", "must be >= 0")
        edges = self.length_edges
        _check(len(edges) > 0 and all(e > 0 for e in edges), "length_edges", "must be positive integers")
        _check(all(a < b for a, b in zip(edges, edges[1:])), "length_edges", "must be strictly increasing")

    def bucket_edges(self) -> tuple[int, ...]:
        """Upper edges actually used: the configured ones below ``max_len``, then ``max_len``."""
        return tuple(e for e in self.length_edges if e < self.max_len) + (self.max_len,)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["length_edges"] = list(self.length_edges)
        data["version"] = CONFIG_VERSION
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplerConfig":
        data = dict(data)
        version = data.pop("version", CONFIG_VERSION)
        if version != CONFIG_VERSION:
            raise QuantkitError(f"calibration.version: unsupported version {version!r} (expected {CONFIG_VERSION})")
        _reject_unknown(data, cls, "calibration")
        if "fields" in data:
            data["fields"] = FieldMap.from_dict(dict(data["fields"]))
        return cls(**data)


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise QuantkitError(f"calibration.{key}: {message}")


def _reject_unknown(data: dict[str, Any], cls: type, where: str) -> None:
    known = {f.name for f in fields(cls)}
    for key in data:
        if key not in known:
            raise QuantkitError(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")
