"""The launch config a load test serves with: ``quantkit plan --emit``'s, from the memory
account (serving/memory_account.py) through the engine's own launch config (contract.py), so the test measures the configuration a user would deploy.

The account's concurrency is the requests at ``max_model_len`` the KV cache holds. On a GPU the
cache gets what the weights leave of ``gpu_mem`` x utilization. vLLM's CPU build gives it a fixed
space instead (``VLLM_CPU_KVCACHE_SPACE`` GiB, apart from the weights) in the dtype the server runs
(float32 there), so on the CPU the account is that space over the bytes one request takes. The
report sets this prediction beside the concurrency the engine logs for the cache it allocated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from quantkit.serving.contract import EngineKind
from quantkit.serving.memory_account import GiB, plan
from quantkit.evaluation.attention_cache import attention_cache
from quantkit.serving.engines import DEFAULT_ENGINE, ENGINES



@dataclass(frozen=True)
class Launch:
    """The emitted launch config and the account's predicted concurrency."""
    config: dict
    predicted_concurrency: int

    def write(self, path: Path) -> Path:
        """The config as ``plan --emit vllm`` prints it: YAML that ``vllm serve --config`` reads."""
        path.write_text(yaml.safe_dump(self.config, sort_keys=False), encoding="utf-8")
        return path


def launch_for(model_dir: Path, max_model_len: int, *, cuda: bool, dtype: str, gpu_mem: str = "80GiB",
               cpu_kv_cache_gib: int = 2, kind: EngineKind | None = None) -> Launch:
    """The launch config for serving ``model_dir`` at ``max_model_len`` with ``kind`` (default: the
    default engine); ``dtype``: what the server runs."""
    kv = "fp32" if dtype in ("float32", "fp32") else "bf16" if dtype in ("bfloat16", "bf16") else "fp16"
    fp = plan(model_dir, gpu_mem=gpu_mem, max_len=max_model_len, kv=kv, cache=attention_cache(model_dir))
    if not cuda:
        fp = replace(fp, gpu_mem_bytes=cpu_kv_cache_gib * GiB, utilization=1.0,
                     concurrency=math.floor(cpu_kv_cache_gib * GiB / fp.kv_bytes_per_request))
    return Launch((kind or ENGINES[DEFAULT_ENGINE]).launch_config(fp, str(model_dir)), fp.concurrency)
