"""The quantization step of each toolkit ``benchmarks/peers.py`` compares, run inside that
toolkit's own interpreter: ``python peer_workers.py SPEC.json RESULT.json``.

Every worker reads the same spec (model folder, calibration rows as token ids, the format and
the recipe's settings), times the quantization call alone with ``time.process_time()`` (one
thread: ``torch.set_num_threads(1)`` and ``OMP_NUM_THREADS=1`` from the parent), records its own
peak RSS (``peak_rss_mib``: model load, quantization and save) and writes:
  - quantkit: its compressed-tensors checkpoint (``QuantizedModel.save``), scored through
    ``quantkit.load``;
  - a peer: the float model with every quantized Linear's weight replaced by the peer's own
    dequantized weight (its fake-quant model), saved as plain safetensors. Each weight is
    checked to hold no more distinct values per group than the format's grid has, so a peer
    that left a weight unquantized fails here instead of scoring as lossless.

This file imports neither quantkit nor the peers at the top: each worker imports only its own
toolkit (the peers pin other versions of transformers and compressed-tensors).
"""
from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

#: distinct values a group of the format can hold (int: 2**bits levels; FP4 E2M1: 15 with one zero)
LEVELS = {"int": lambda bits: 2 ** bits, "nvfp4": lambda bits: 15, "mxfp4": lambda bits: 15}


# -- shared by the peers' workers -------------------------------------------------------------
def float_model(folder: str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def check_grid(name: str, w, fmt: dict) -> None:
    """Refuse a weight with more distinct values in a group than the format's grid has."""
    import torch

    group = fmt["group_size"]
    if w.shape[-1] % group:
        return   # a ragged last group: the peer chose its own layout
    levels = LEVELS[fmt["type"]](fmt["bits"])
    g = w.detach().float().reshape(-1, group)[:64]
    worst = max(int(torch.unique(row).numel()) for row in g)
    if worst > levels:
        raise RuntimeError(f"{name}: {worst} distinct values in a group of {group}, the grid has {levels}: "
                           "the weight was not quantized")


def save_fake_quant(folder: str, weights: dict, fmt: dict, out: str) -> dict:
    """The float model of ``folder`` with ``weights`` (module name -> dequantized weight) in place
    of its own, saved to ``out``; says how many of its Linear layers (``lm_head`` aside) the peer
    quantized, since a peer may keep a layer it cannot group in float without an error."""
    import torch

    model = float_model(folder)
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    for name, w in weights.items():
        check_grid(name, w, fmt)
        with torch.no_grad():
            target = model.get_submodule(name).weight
            if tuple(w.shape) != tuple(target.shape):
                raise RuntimeError(f"{name}: the toolkit's weight is {tuple(w.shape)}, the model's {tuple(target.shape)}")
            target.copy_(w.to(torch.float32))
    model.save_pretrained(out)
    kept = [n for n in linears if n not in weights]
    note = f"{len(kept)} of {len(linears)} Linear layers left in float by the toolkit (e.g. {kept[0]})" if kept else ""
    return {"linears": len(weights), "note": note}


def batches(rows: list[list[int]], size: int):
    import torch

    return [torch.tensor(rows[i:i + size]) for i in range(0, len(rows), size)]


# -- quantkit ---------------------------------------------------------------------------------
def run_quantkit(spec: dict) -> dict:
    import quantkit

    recipe = spec["recipe"]
    calib = spec["calibration"] if quantkit.load_recipe(recipe).needs_calibration else None
    c0 = time.process_time()
    q = quantkit.quantize(spec["model_dir"], recipe, calib, quantkit.ConvertOptions(out=spec["out"]))
    cpu = time.process_time() - c0
    q.save()
    return {"cpu_s": cpu}


# -- llm-compressor ---------------------------------------------------------------------------
def llmc_modifier(spec: dict):
    """QuantizationModifier (RTN) or GPTQModifier with llm-compressor's own defaults (act-order
    "static", block 128, damping 0.01), optionally with its importance-weighted observer."""
    from compressed_tensors.quantization import QuantizationScheme, preset_name_to_scheme
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    s = spec["llmc"]
    if "scheme" in s:
        scheme = preset_name_to_scheme(s["scheme"], ["Linear"])
    else:
        scheme = QuantizationScheme(targets=["Linear"], weights=s["weights"])
    if s.get("observer"):
        scheme.weights.observer = s["observer"]
    kind = GPTQModifier if s["gptq"] else QuantizationModifier
    return kind(config_groups={"group_0": scheme}, ignore=["lm_head"])


def run_llmc(spec: dict) -> dict:
    import torch
    from compressed_tensors.quantization.lifecycle.forward import forward_quantize
    from datasets import Dataset
    from llmcompressor import oneshot

    model = float_model(spec["model_dir"])
    modifier = llmc_modifier(spec)
    calib = spec["calibration"]
    c0 = time.process_time()
    if spec["llmc"]["calibrate"]:
        ds = Dataset.from_dict({"input_ids": calib, "attention_mask": [[1] * len(c) for c in calib]})
        oneshot(model=model, dataset=ds, recipe=modifier, max_seq_length=spec["seq_len"],
                num_calibration_samples=len(calib), shuffle_calibration_samples=False)
    else:
        oneshot(model=model, recipe=modifier)
    cpu = time.process_time() - c0
    weights = {}
    with torch.no_grad():
        for name, m in model.named_modules():
            scheme = getattr(m, "quantization_scheme", None)
            if scheme is not None and scheme.weights is not None and hasattr(m, "weight_scale"):
                weights[name] = forward_quantize(m, m.weight, "weight", scheme.weights)
    return {"cpu_s": cpu, **save_fake_quant(spec["model_dir"], weights, spec["format"], spec["out"])}


# -- AutoRound --------------------------------------------------------------------------------
def run_autoround(spec: dict) -> dict:
    import torch
    from auto_round import AutoRound
    from transformers import AutoTokenizer

    a = spec["autoround"]
    model = float_model(spec["model_dir"])
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    calib = spec["calibration"]
    options = {k: v for k, v in a["options"].items() if v is not None}
    ar = AutoRound(model, tokenizer=tok, scheme=a["scheme"], dataset=batches(calib, options.get("batch_size", 8)),
                   nsamples=len(calib), seqlen=len(calib[0]), device_map="cpu", **options)
    c0 = time.process_time()
    ar.quantize()
    cpu = time.process_time() - c0
    weights = {}
    with torch.no_grad():
        for name, m in ar.model.named_modules():
            if isinstance(m, torch.nn.Linear) and name != "lm_head" and hasattr(m, "scale"):
                weights[name] = m.weight.detach().clone()
    return {"cpu_s": cpu, **save_fake_quant(spec["model_dir"], weights, spec["format"], spec["out"])}


# -- GPTQModel --------------------------------------------------------------------------------
def run_gptqmodel(spec: dict) -> dict:
    import os

    # GPTQModel 7.7 sizes its CPU pool at (cores + 1) // 2, one worker on a 2-core host, and then
    # refuses its own model loader's two ("Virtual pool 'model_loader:cpu' requests 2 workers but
    # parent 'cpu' only has 1"): two workers is the least it runs with
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig

    g = spec["gptqmodel"]
    # its default offloads each finished layer to disk and leaves meta tensors in the model: kept
    # in memory here, so that its own dequantize_weight can read the packed layers back
    config = QuantizeConfig(**g["config"], offload_to_disk=False)
    model = GPTQModel.load(spec["model_dir"], config, device="cpu")
    rows = [{"input_ids": r, "attention_mask": [1] * len(r)} for r in spec["calibration"]]
    c0 = time.process_time()
    model.quantize(rows, batch_size=1)
    cpu = time.process_time() - c0
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module

    weights = {}
    with torch.no_grad():
        for name, m in model.model.named_modules():
            if hasattr(m, "dequantize_weight"):
                # freshly packed layers hold v1 zero points (stored minus one); dequantize_weight reads
                # v2, as its loader converts them (measured: read as v1, perplexity 1.2e9)
                if m.qzero_format() == 1:
                    convert_gptq_v1_to_v2_format_module(m, m.bits, m.pack_dtype)
                weights[name] = m.dequantize_weight().T   # GPTQ packs [in, out]
    return {"cpu_s": cpu, **save_fake_quant(spec["model_dir"], weights, spec["format"], spec["out"])}


WORKERS = {"quantkit": run_quantkit, "llmc": run_llmc, "autoround": run_autoround, "gptqmodel": run_gptqmodel}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", type=Path, help="the cell's JSON spec (written by benchmarks/peers.py)")
    ap.add_argument("result", type=Path, help="where the worker writes its JSON result")
    a = ap.parse_args()
    spec = json.loads(a.spec.read_text())
    import torch

    torch.set_num_threads(1)
    try:
        out = WORKERS[spec["toolkit"]](spec)
    except Exception as e:   # the peer's own error, quoted in the table
        out = {"error": f"{type(e).__name__}: {e}".strip()[:1500], "traceback": traceback.format_exc()[-4000:]}
    out["peak_rss_mib"] = peak_rss_mib()
    a.result.write_text(json.dumps(out))


def peak_rss_mib() -> float | None:
    """This process's own peak RSS (VmHWM, reset by exec). ``getrusage`` is no use here: on Linux
    a child's ``ru_maxrss`` starts from its parent's peak at the fork (a worker that failed in 20 s
    reported the parent's 2,464 MiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


if __name__ == "__main__":
    main()
