"""A recipe's run settings: ``calibration:`` (how many samples, how long, how they are drawn and
held) and ``output:`` (the shard size), validated like every recipe key."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, StrictBool, StrictInt, StrictStr

from quantkit.config.sizes import size_bytes
from quantkit.config.validation import config, invalid, short


def _read_size(value: Any) -> Any:
    if isinstance(value, str):
        size = size_bytes(value)
        if size is None:
            raise invalid(f"cannot read size {short(value)} (e.g. '2GB', '500MiB')")
        return size
    return value


#: A number of bytes, or a size such as "2GB" / "500MiB" in a recipe (read as quantkit/config/sizes.py says).
ByteSize = Annotated[StrictInt, BeforeValidator(_read_size)]


@config
class CalibrationSettings:
    num_samples: Annotated[StrictInt, Field(ge=1)] = 128
    max_seq_len: Annotated[StrictInt, Field(ge=8)] = 512
    seed: StrictInt = 0
    dataset: StrictStr | None = None  # a path; None: the embedded default sample
    # samples per (task x length) cell when a log is sampled: calibration/allocate.py's POLICIES
    policy: Literal["traffic", "sqrt", "balanced"] = "traffic"
    # Calibration tokens run through a layer in one call (samples packed into rows). None:
    # as many as fit a quarter of the free memory, normally all of them (one pass per layer).
    batch_tokens: Annotated[StrictInt, Field(gt=0)] | None = None
    # Keep the calibration hidden states in files next to the output between layers (only
    # the batch being run is in memory): for models whose activations do not fit.
    offload: StrictBool = False
    # MoE experts: "all" runs every calibration token through every expert for its statistics
    # (the layer's output still sums the top-k experts only), "routed" only its routed tokens
    # (pipeline/coverage.py). Experts whose linears saw fewer than moe_min_tokens are flagged.
    moe_experts: Literal["all", "routed"] = "all"
    moe_min_tokens: Annotated[StrictInt, Field(ge=0)] = 32
    # Bytes of one decoder layer's weights held at once (bytes, or "4GB"). A layer whose weights
    # exceed it has its MoE experts onloaded a chunk at a time (pipeline/expert_stream.py). None:
    # a fifth of the memory available when the layer loop starts (a cgroup limit counts).
    layer_memory: Annotated[ByteSize, Field(ge=1)] | None = None


@config
class OutputSettings:
    max_shard_size: Annotated[ByteSize, Field(ge=1024)] = 2 * 1024**3  # bytes, or "2GB" in a recipe
