"""llm-compressor's AWQ (``AWQModifier`` + ``QuantizationModifier``) as a benchmark worker.

Runs in llm-compressor's own interpreter (``.venv-llmc/bin/python``; it pins other versions
of compressed-tensors and transformers than quantkit), one process per run, the way
``benchmarks/gptq.py`` runs its ``worker_llmc``::

    .venv-llmc/bin/python benchmarks/llmc_awq.py --worker llmc_awq spec.json result.json

The spec has ``gptq.py``'s keys: ``model_dir``, ``calibration`` (token-id lists), ``seq_len``,
``group_size``, ``threads``, ``eval`` (token windows), ``bos``; plus ``duo_scaling`` (True,
False or "both"; default True, llm-compressor's default) and ``n_grid`` (default 20, its
default). The recipe is ``[AWQModifier(duo_scaling=...), QuantizationModifier(W4A16
symmetric, group ``group_size``, targets Linear, ignore lm_head)]``: AWQ in llm-compressor
0.14 is a transform only (it rescales smooth/balance layers), the QuantizationModifier
after it puts the grid on the weights (round-to-nearest with min-max ranges). AWQ's mappings
are its defaults for the architecture (``get_layer_mappings_from_model``: Llama's
norm->qkv, v->o, norm->gate/up, up->down; Gemma3's v->o, pre-ff-norm->gate/up, up->down; AWQ
itself skips v->o where grouped-query attention makes the shapes differ, as in SmolLM2).
The result: ``seconds`` and ``cpu_seconds`` (model load + oneshot), ``peak_rss_mb_quantize``,
``perplexity`` (``gptq.perplexity`` on the fake-quantized model), and, to see where the
time goes, ``smoothing_seconds`` (per sequential layer: the grid searches of its mappings)
and ``mappings`` (per smoothed mapping: initial and best grid-search loss).

CPU: as shipped, AWQ cannot run without an accelerator. Before each mapping's grid search
``AWQModifier._apply_smoothing`` (llmcompressor/modifiers/transform/awq/base.py, line 507)
calls ``IntermediatesCache.pin_memory`` on its cached parent-module inputs, which calls
``torch.Tensor.pin_memory()`` on every CPU tensor (llmcompressor/pipelines/cache.py,
line 155); with the CPU build of torch that raises ``RuntimeError: Cannot access
accelerator device when none is available.`` No argument avoids it on a CPU-only machine (the
cache holds CPU tensors whatever ``offload_device`` is). Pinning only speeds host-to-device
copies and changes no value, and here there is no device, so ``cpu_pin_memory_noop`` makes
``IntermediatesCache.pin_memory`` a no-op in this process when no accelerator is present.
Spec ``cpu_workaround: false`` leaves it out (to see the error).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from gptq import peak_rss_mb, perplexity, scheme_dict  # noqa: E402  (stdlib-only at import)


def cpu_pin_memory_noop() -> bool:
    """Make llm-compressor's ``IntermediatesCache.pin_memory`` a no-op when torch has no
    accelerator (the only call that stops AWQ on the CPU). Returns whether it patched."""
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    if torch.accelerator.is_available():
        return False

    def pin_memory(self, batch_index: int, input_names: list[str] | None = None) -> None:
        return None  # nothing to pin for: the cache is read on the CPU it lives on

    IntermediatesCache.pin_memory = pin_memory
    return True


def quantize_llmc_awq(spec: dict):
    """llm-compressor's AWQModifier then QuantizationModifier, W4A16 symmetric, group
    ``group_size``: returns the fake-quantized model and the figures (no perplexity)."""
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(spec["threads"])
    patched = cpu_pin_memory_noop() if spec.get("cpu_workaround", True) else False

    # Observation only: time of each sequential layer's smoothing, and the grid-search
    # losses AWQ keeps until it logs them at finalize (then clears them).
    smoothing_seconds: list[float] = []
    mappings: list[dict] = []
    apply_smoothing, log_metrics = AWQModifier._apply_smoothing, AWQModifier._log_error_metrics

    def timed_apply_smoothing(self, model):
        t = time.perf_counter()
        apply_smoothing(self, model)
        smoothing_seconds.append(time.perf_counter() - t)

    def kept_log_metrics(self):
        mappings.extend({k: float(v) if k.endswith(("error", "reduction")) else v for k, v in m.items()}
                        for m in self._error_metrics)
        log_metrics(self)

    AWQModifier._apply_smoothing, AWQModifier._log_error_metrics = timed_apply_smoothing, kept_log_metrics

    calib = spec["calibration"]
    t0, c0 = time.perf_counter(), time.process_time()
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    ds = Dataset.from_dict({"input_ids": calib, "attention_mask": [[1] * len(c) for c in calib]})
    recipe = [AWQModifier(duo_scaling=spec.get("duo_scaling", True), n_grid=spec.get("n_grid", 20)),
              QuantizationModifier(config_groups=scheme_dict(spec["group_size"], None), ignore=["lm_head"])]
    oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=spec["seq_len"],
            num_calibration_samples=len(calib), shuffle_calibration_samples=False)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    rss = peak_rss_mb()
    out = {"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_mb_quantize": rss,
           "pin_memory_patched": patched, "smoothing_seconds": smoothing_seconds, "mappings": mappings}
    return model, out


def worker_llmc_awq(spec: dict) -> dict:
    model, out = quantize_llmc_awq(spec)
    out["perplexity"] = perplexity(model, spec["eval"], spec["bos"])
    return out


WORKERS = {"llmc_awq": worker_llmc_awq, "run": worker_llmc_awq}  # "run": the kind benchmarks/awq.py passes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "SPEC", "RESULT"), required=True,
                    help="KIND: llmc_awq (or run); SPEC: json spec to read; RESULT: json result to write")
    kind, spec_path, result_path = ap.parse_args().worker
    if kind not in WORKERS:
        ap.error(f"unknown worker {kind!r} (have: {', '.join(WORKERS)})")
    out = WORKERS[kind](json.loads(Path(spec_path).read_text()))
    Path(result_path).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
