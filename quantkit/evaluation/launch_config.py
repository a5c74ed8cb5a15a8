"""A vLLM launch configuration from the memory account (plan.py): ``quantkit plan --emit vllm``.

- ``max_num_seqs``: 80% of the requests at ``max_len`` that fit beside the weights. The account
  leaves out activations and the engine's own buffers; running below the bound keeps the cache
  from preempting requests at peak.
- ``gpu_memory_utilization``: the account's share, 0.90 by default.
- ``max_num_batched_tokens``: the prefill chunk. 2048 for chat-length contexts (up to 8192
  tokens), 4096 up to 32768, 8192 beyond: longer prompts amortise bigger chunks, and shorter
  chunks keep decoding steps between them short.
- chunked prefill and prefix caching on.
- ``kv_cache_dtype``: fp8 when the evaluated cache is FP8, else the model's.
"""
from __future__ import annotations

import math
import shlex

from quantkit.errors import QuantkitError
from quantkit.evaluation.plan import Footprint

SEQS_SHARE = 0.8


def batched_tokens(max_len: int) -> int:
    """The prefill chunk for contexts of ``max_len`` tokens (see the module docstring).

    >>> batched_tokens(4096), batched_tokens(16384), batched_tokens(131072)
    (2048, 4096, 8192)
    """
    return 2048 if max_len <= 8192 else 4096 if max_len <= 32768 else 8192


def vllm_launch(fp: Footprint, model: str) -> dict:
    """The launch settings for ``model`` under the footprint ``fp`` (vLLM's ``--config`` YAML keys)."""
    if fp.concurrency < 1:
        raise QuantkitError(f"--gpu-mem: the weights and one request of {fp.max_len} tokens do not fit in "
                            f"{fp.gpu_mem_bytes / 2**30:g} GiB x {fp.utilization:g}: no launch config")
    return {"model": model, "max_model_len": fp.max_len,
            "max_num_seqs": max(1, math.floor(SEQS_SHARE * fp.concurrency)),
            "gpu_memory_utilization": fp.utilization, "max_num_batched_tokens": batched_tokens(fp.max_len),
            "enable_chunked_prefill": True, "enable_prefix_caching": True,
            "kv_cache_dtype": "fp8" if fp.kv_dtype.startswith("fp8") else "auto"}


def command_line(cfg: dict) -> str:
    """The same settings as a ``vllm serve`` command line."""
    args = ["vllm", "serve", cfg["model"]]
    for key, value in cfg.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [] if value is False else [flag, str(value)]
    return shlex.join(args)
