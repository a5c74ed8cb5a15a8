"""``quantkit plan``'s work: the deployment footprint of a model folder, a ``config.json`` or a
quantized checkpoint, at a GPU size and a context length."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.evaluation.attention_cache import attention_cache
from quantkit.evaluation.footprint import checkpoint_format
from quantkit.serving.engines import engine_kind
from quantkit.evaluation.checkpoint import resolve_dir
from quantkit.serving.memory_account import BITS, WeightFormat, plan
from quantkit.kv_cache import kv_option
from quantkit.serving.deployment import context_limit

#: the context ``plan`` accounts for when none is asked, capped at the model's own
PLAN_DEFAULT_LEN = 8192


@dataclass(frozen=True)
class PlanRequest:
    """What ``quantkit plan`` was asked (each field is the flag of its name)."""

    model: str | None = None
    gpu_mem: str = "80GiB"
    max_len: int | None = None
    weights: str | None = None      # None: the checkpoint's own format (a float model's kept)
    kv: str = "fp16"                # a KV type, or a quantized-KV option as ``quantkit eval --kv`` names it
    group_size: int = 128
    utilization: float = 0.9
    emit: str | None = None         # an engine whose launch config is wanted (``--emit``)


@dataclass(frozen=True)
class DeploymentPlan:
    footprint: object               # serving.memory_account.Footprint
    target: Path                    # the folder or config.json accounted for
    note: str | None                # what the user should know about the length asked
    launch_config: dict | None = None   # ``emit``'s engine's, from the footprint
    command_line: str | None = None     # the same as that engine's command line


def deployment_plan(request: PlanRequest) -> DeploymentPlan:
    """The footprint ``request`` asks for; a bad flag raises ``QuantkitError`` naming it."""

    option, kv = None, request.kv
    if kv not in BITS:   # an option's error names --kv and lists the options
        option, kv = kv_option(kv), "fp16"
    model = request.model
    target = Path(model if model and Path(model).is_file() else resolve_dir(model))
    max_len, note = plan_length(target, request.max_len)
    fmt = (WeightFormat(request.weights, request.group_size) if request.weights
           else checkpoint_format(target, request.group_size))
    fp = plan(target, request.gpu_mem, max_len, weights=fmt, kv=kv, utilization=request.utilization,
              kv_option=option, cache=attention_cache(target))
    if request.emit is None:
        return DeploymentPlan(fp, target, note)
    kind = engine_kind(request.emit, "--emit")
    cfg = kind.launch_config(fp, str(model or target))
    return DeploymentPlan(fp, target, note, cfg, kind.command_line(cfg))


def plan_length(target: Path, asked: int | None) -> tuple[int, str | None]:
    """The context ``plan`` accounts for: ``asked``, else 8192 capped at the model's own
    ``max_position_embeddings``; with a note when what was asked goes past the model's."""

    limit = context_limit(target.parent if target.is_file() else target)
    if asked is None:
        return (min(PLAN_DEFAULT_LEN, limit) if limit else PLAN_DEFAULT_LEN), None
    if asked < 1:
        raise QuantkitError(f"--max-len: expected 1 or more, got {asked}")
    if limit and asked > limit:
        return asked, (f"--max-len {asked} exceeds the model's max_position_embeddings ({limit}), as asked: vLLM "
                       "refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and the model was not trained that long")
    return asked, None
