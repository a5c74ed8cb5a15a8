"""Peers side by side: quantkit, AutoRound, GPTQModel and llm-compressor on the same model, the
same calibration rows and the same held-out text, each toolkit's default and best recipe per format.

Cells: model x format x toolkit x recipe, for the formats W4A16 g128, W4A16 g64, W3A16 g64,
NVFP4A16 and MXFP4A16 (``FORMATS``) and the recipes of ``recipes_for``:
  - quantkit: ``rtn`` and ``gptq`` (the shipped recipes, run as ``benchmarks/formats.py`` labels
    run them); the variants of ``QUANTKIT_VARIANTS`` on them (``rtn-imatrix``, ``gptaq``,
    ``gptq-imatrix``, ``gptaq-imatrix``, ``learned-fast``, ``learned`` and the last two from
    importance-weighted ranges), in every format alike; and every shipped ``recipes/*-best.yaml``, ``*-learned*.yaml`` and ``*-gptaq*.yaml`` whose name starts with the
    format's RTN recipe, found when the run starts (``best``: the recipe the format ships as best);
  - llm-compressor 0.14: ``rtn`` (QuantizationModifier), ``gptq`` (GPTQModifier, its defaults:
    act-order "static", block 128, damping 0.01), ``gptq-imatrix`` (the same with its
    importance-weighted ``imatrix_mse`` weight observer);
  - AutoRound 0.16.1: ``default`` (200 steps), ``light`` (50 steps, lr 5e-3) and ``best`` (1000
    steps), its CLI's presets (``auto_round/cli/main.py`` RECIPES) with batch 8, their own sample
    counts and lengths (128 or 512 x 2048 tokens) giving way to the shared rows; and ``rtn`` (0
    steps: its round to nearest on its own grid, after its default scale search);
  - GPTQModel 7.7: ``gptq`` (its QuantizeConfig defaults) and ``gptaq`` (GPTAQ).

Each cell's quantization runs in a subprocess with the toolkit's own interpreter
(``benchmarks/peer_workers.py``), one thread (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``;
``torch.compile``, which AutoRound and quantkit's learned rounding use, compiling in that process into
an empty cache of the cell's own, ``TORCHINDUCTOR_COMPILE_THREADS=1``, ``TORCHINDUCTOR_CACHE_DIR``):
CPU s is the process CPU time of the quantization call alone; peak RSS is the worker's own high-water
mark (``VmHWM``), so it covers the whole worker (model load and save included): the child's
``ru_maxrss`` is not used, since on Linux it starts from the parent's peak at the fork.
quantkit writes its compressed-tensors checkpoint, scored through ``quantkit.load``; a peer
writes its fake-quant model (the float model with the peer's dequantized weights) as plain
safetensors, since quantkit does not read AutoRound's or GPTQModel's packed formats. For weight-only
formats the fake-quant model computes what the packed one does, up to kernel rounding.

Scoring, in this interpreter, the same for every cell: held-out perplexity on the text and
windows of ``benchmarks/gptq.py`` (the Lee corpus' first ``--eval-windows`` windows of
``--seq-len`` tokens), and quantkit's mean KL(float || quantized) per token over the default
suite's slices (``quantkit.evaluation.evaluate`` on their text items, teacher-forced; multiple
choice, extraction, code and generation left out; the long slices' windows up to ``--kl-max-len``
tokens). The calibration rows are ``--samples`` windows at offsets drawn with
``--seed`` from the rest of the Lee corpus, written once per model and seed to a JSON file every
worker reads; three seeds give the run-to-run noise.

Each finished cell appends one JSON line to ``--results``; a cell already there is skipped, so a
stopped run resumes. ``--report`` prints the Markdown tables from that file alone.

The peers pin other versions than quantkit: each lives in its own venv, which this script never
installs (``scripts/setup.sh`` does not either). All three take the CPU build of torch 2.13.0
from ``constraints-cpu.txt``; PyPI's torchvision, torchaudio and torchcodec builds break
``import transformers`` here, so they are removed::

    python3 -m venv .venv-llmc
    .venv-llmc/bin/pip install "llmcompressor==0.14.0.1" "torch==2.13.0" -c constraints-cpu.txt
    .venv-llmc/bin/pip uninstall -y torchvision torchaudio torchcodec

    python3 -m venv .venv-autoround
    .venv-autoround/bin/pip install "auto-round==0.16.1" "torch==2.13.0" -c constraints-cpu.txt
    .venv-autoround/bin/pip uninstall -y torchvision torchaudio torchcodec

    # gptqmodel 7.7 requires torch>=2.14.1, which pip refuses beside torch==2.13.0
    # ("ResolutionImpossible"): its other requirements first, then the package without them
    python3 -m venv .venv-gptqmodel
    .venv-gptqmodel/bin/pip download --no-deps --no-binary :all: "gptqmodel==7.7" -d /tmp/gptqmodel
    tar xzf /tmp/gptqmodel/gptqmodel-7.7.0.tar.gz -C /tmp/gptqmodel
    grep -v '^torch>=' /tmp/gptqmodel/gptqmodel-7.7.0/requirements.txt > /tmp/gptqmodel/reqs.txt
    .venv-gptqmodel/bin/pip install -r /tmp/gptqmodel/reqs.txt "torch==2.13.0" -c constraints-cpu.txt
    .venv-gptqmodel/bin/pip install --no-deps "gptqmodel==7.7"
    .venv-gptqmodel/bin/pip uninstall -y torchvision torchaudio torchcodec

Usage:
    python benchmarks/peers.py --models smollm2 --formats w4a16-g128 --only quantkit:rtn,llmc:rtn
    python benchmarks/peers.py --models smollm2,gemma3 --seed 1 --only autoround:default
    python benchmarks/peers.py --report
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKER = HERE / "peer_workers.py"
CACHE = ROOT / ".cache" / "benchmarks" / "peers"

#: format -> what the workers check their weights against (grid type, bits, group size)
FORMATS = {
    "w4a16-g128": {"type": "int", "bits": 4, "group_size": 128},
    "w4a16-g64": {"type": "int", "bits": 4, "group_size": 64},
    "w3a16-g64": {"type": "int", "bits": 3, "group_size": 64},
    "nvfp4a16": {"type": "nvfp4", "bits": 4, "group_size": 16},
    "mxfp4a16": {"type": "mxfp4", "bits": 4, "group_size": 32},
}
#: format -> quantkit's RTN and GPTQ runs, as benchmarks/formats.py labels (FP4 GPTQ with act-order
#: "weight", as the shipped nvfp4a16-gptq)
QUANTKIT = {
    "w4a16-g128": ("w4a16", "w4a16-gptq"),
    "w4a16-g64": ("w4a16-g64", "w4a16-g64-gptq"),
    "w3a16-g64": ("w3a16-g64", "w3a16-g64-gptq"),
    "nvfp4a16": ("nvfp4a16", "nvfp4a16-gptq-actorder"),
    "mxfp4a16": ("mxfp4a16", "mxfp4a16-gptq-actorder"),
}
#: quantkit variant -> (the run it edits: "rtn" or "gptq", what it changes): algorithm keys
#: merged into the recipe's ``algorithm`` (``name`` replaces it), ``observer`` set on its weights
QUANTKIT_VARIANTS = {
    "rtn-imatrix": ("gptq", {"algorithm": {"name": "rtn"}, "observer": "imatrix_mse"}),
    "gptaq": ("gptq", {"algorithm": {"gptaq": True}}),
    "gptq-imatrix": ("gptq", {"observer": "imatrix_mse"}),
    "gptaq-imatrix": ("gptq", {"algorithm": {"gptaq": True}, "observer": "imatrix_mse"}),
    "learned-fast": ("rtn", {"algorithm": {"name": "learned_rounding", "preset": "fast"}}),
    "learned": ("rtn", {"algorithm": {"name": "learned_rounding"}}),
    # learning from the importance-weighted ranges (the GPTQ run's config groups carry the
    # observer; learned rounding takes act-order "weight" as no order at all)
    "learned-fast-imatrix": ("gptq", {"algorithm": {"name": "learned_rounding", "preset": "fast"},
                                      "observer": "imatrix_mse"}),
    "learned-imatrix": ("gptq", {"algorithm": {"name": "learned_rounding"}, "observer": "imatrix_mse"}),
}
#: llm-compressor: a compressed-tensors preset, or the weights' QuantizationArgs
LLMC_SCHEME = {
    "w4a16-g128": {"scheme": "W4A16"},
    "w4a16-g64": {"weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 64}},
    "w3a16-g64": {"weights": {"num_bits": 3, "type": "int", "symmetric": True, "strategy": "group", "group_size": 64}},
    "nvfp4a16": {"scheme": "NVFP4A16"},
    "mxfp4a16": {"scheme": "MXFP4A16"},
}
LLMC_RECIPES = {"rtn": {"gptq": False}, "gptq": {"gptq": True}, "gptq-imatrix": {"gptq": True, "observer": "imatrix_mse"}}
#: AutoRound: its scheme as a dict (weight-only: act_bits 16; its NVFP4 / MXFP4 presets quantize activations)
AUTOROUND_SCHEME = {
    "w4a16-g128": {"bits": 4, "group_size": 128, "sym": True, "data_type": "int", "act_bits": 16},
    "w4a16-g64": {"bits": 4, "group_size": 64, "sym": True, "data_type": "int", "act_bits": 16},
    "w3a16-g64": {"bits": 3, "group_size": 64, "sym": True, "data_type": "int", "act_bits": 16},
    "nvfp4a16": {"bits": 4, "group_size": 16, "sym": True, "data_type": "nv_fp", "act_bits": 16},
    "mxfp4a16": {"bits": 4, "group_size": 32, "sym": True, "data_type": "mx_fp", "act_bits": 16},
}
#: AutoRound's CLI presets (auto_round/cli/main.py RECIPES), less their sample counts and lengths
AUTOROUND_RECIPES = {"rtn": {"iters": 0, "batch_size": 8, "lr": None},   # its own grid, no learning
                     "default": {"iters": 200, "batch_size": 8, "lr": None},
                     "light": {"iters": 50, "batch_size": 8, "lr": 5e-3},
                     "best": {"iters": 1000, "batch_size": 8, "lr": None}}
#: GPTQModel: QuantizeConfig keywords per format (int formats only) and per recipe
GPTQMODEL_FORMAT = {"w4a16-g128": {"bits": 4, "group_size": 128, "sym": True},
                    "w4a16-g64": {"bits": 4, "group_size": 64, "sym": True},
                    "w3a16-g64": {"bits": 3, "group_size": 64, "sym": True}}
GPTQMODEL_RECIPES = {"gptq": {}, "gptaq": {"gptaq": {}}}
#: why a toolkit has no cell for a format (its row says so instead)
NOT_OFFERED = {("gptqmodel", "nvfp4a16"): "GPTQModel 7.7 has no GPTQ for FP4 weights (its NVFP4 is a weight-only RTN fallback)",
               ("gptqmodel", "mxfp4a16"): "GPTQModel 7.7 has no MXFP4 weight format"}
TOOLKITS = ("quantkit", "llmc", "autoround", "gptqmodel")
VENVS = {"llmc": ".venv-llmc", "autoround": ".venv-autoround", "gptqmodel": ".venv-gptqmodel"}


# -- cells ------------------------------------------------------------------------------------
def quantkit_extras(fmt: str, names: list[str]) -> dict[str, str]:
    """Recipe names among ``names`` that are learned-rounding or GPTAQ variants of ``fmt``'s RTN
    recipe: ``w4a16-g64-learned`` -> {"learned": "w4a16-g64-learned"}.

    >>> quantkit_extras("w4a16-g64", ["w4a16-learned", "w4a16-g64-learned-fast", "w4a16-g64-gptq-gptaq",
    ...                               "w4a16-g64-best", "w4a16-best"])
    {'best': 'w4a16-g64-best', 'gptq-gptaq': 'w4a16-g64-gptq-gptaq', 'learned-fast': 'w4a16-g64-learned-fast'}
    """
    base = QUANTKIT[fmt][0]
    out = {}
    for name in sorted(names):
        m = re.fullmatch(rf"{re.escape(base)}-(best|(?:gptq-)?(?:learned|gptaq).*)", name)
        if m:
            out[m.group(1)] = name
    return out


def recipes_for(toolkit: str, fmt: str, shipped: list[str] | None = None) -> dict[str, dict]:
    """Recipe name -> what the worker runs, for one toolkit and format (one recipe "-" saying why
    where the toolkit offers no such format). ``shipped``: quantkit's recipe names (default: those in ``recipes/``).

    >>> sorted(recipes_for("llmc", "nvfp4a16"))
    ['gptq', 'gptq-imatrix', 'rtn']
    >>> recipes_for("gptqmodel", "mxfp4a16")
    {'-': {'not_offered': 'GPTQModel 7.7 has no MXFP4 weight format'}}
    """
    if toolkit == "quantkit":
        names = shipped if shipped is not None else [p.stem for p in (ROOT / "recipes").glob("*.yaml")]
        runs = dict(zip(("rtn", "gptq"), QUANTKIT[fmt]))
        return {"rtn": {"label": runs["rtn"]}, "gptq": {"label": runs["gptq"]},
                **{k: {"label": runs[on], "edit": edit} for k, (on, edit) in QUANTKIT_VARIANTS.items()},
                **{k: {"label": v} for k, v in quantkit_extras(fmt, names).items()}}
    if toolkit == "llmc":
        return {name: {**LLMC_SCHEME[fmt], **r} for name, r in LLMC_RECIPES.items()}
    if toolkit == "autoround":
        return {name: {"scheme": AUTOROUND_SCHEME[fmt], "options": r} for name, r in AUTOROUND_RECIPES.items()}
    if (toolkit, fmt) in NOT_OFFERED:
        return {"-": {"not_offered": NOT_OFFERED[toolkit, fmt]}}
    if toolkit == "gptqmodel":
        return {name: {"config": {**GPTQMODEL_FORMAT[fmt], **r}} for name, r in GPTQMODEL_RECIPES.items()}
    raise ValueError(f"unknown toolkit {toolkit!r} (known: {', '.join(TOOLKITS)})")


def parse_only(only: str | None) -> list[tuple[str, str | None]]:
    """``--only`` as (toolkit, recipe or None for all its recipes).

    >>> parse_only("quantkit:gptq,autoround")
    [('quantkit', 'gptq'), ('autoround', None)]
    """
    if not only:
        return [(t, None) for t in TOOLKITS]
    out = []
    for item in only.split(","):
        toolkit, _, recipe = item.strip().partition(":")
        if toolkit not in TOOLKITS:
            raise ValueError(f"--only: unknown toolkit {toolkit!r} (known: {', '.join(TOOLKITS)})")
        out.append((toolkit, recipe or None))
    return out


def cells(formats: list[str], only: str | None, shipped: list[str] | None = None) -> list[tuple[str, str, str, dict]]:
    """(format, toolkit, recipe, worker settings) for every cell asked for, in format order.

    >>> [c[:3] for c in cells(["w3a16-g64"], "llmc:gptq,gptqmodel", shipped=[])]
    [('w3a16-g64', 'llmc', 'gptq'), ('w3a16-g64', 'gptqmodel', 'gptq'), ('w3a16-g64', 'gptqmodel', 'gptaq')]
    """
    picks = parse_only(only)
    out = []
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"--formats: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
        for toolkit, recipe in picks:
            known = recipes_for(toolkit, fmt, shipped)
            if recipe is not None and recipe not in known and "-" not in known:
                raise ValueError(f"--only: {toolkit} has no recipe {recipe!r} for {fmt} (known: {', '.join(known)})")
            for name, settings in known.items():
                if recipe in (None, name) or name == "-":
                    out.append((fmt, toolkit, name, settings))
    return out


def worker_spec(toolkit: str, fmt: str, settings: dict, data: dict) -> dict:
    """The JSON a worker reads: the shared data plus this toolkit's settings for the cell."""
    spec = {**data, "toolkit": toolkit, "format": FORMATS[fmt]}
    if toolkit == "quantkit":
        sys.path.insert(0, str(HERE))
        from formats import recipe_of

        spec["recipe"] = edited(recipe_of(settings["label"], len(data["calibration"]), data["seq_len"]),
                                settings.get("edit", {}))
    elif toolkit == "llmc":
        spec["llmc"] = {**settings, "calibrate": bool(settings["gptq"] or settings.get("observer"))}
    else:
        spec[toolkit] = settings
    return spec


def edited(recipe: dict, edit: dict) -> dict:
    """``recipe`` with a ``QUANTKIT_VARIANTS`` edit applied (a copy).

    >>> r = {"config_groups": {"group_0": {"weights": {"num_bits": 4}}}, "algorithm": {"name": "gptq"}}
    >>> edited(r, {"algorithm": {"gptaq": True}, "observer": "imatrix_mse"})
    {'config_groups': {'group_0': {'weights': {'num_bits': 4, 'observer': 'imatrix_mse'}}}, 'algorithm': {'name': 'gptq', 'gptaq': True}}
    >>> edited({"scheme": "NVFP4A16", "algorithm": {"name": "rtn"}}, {"algorithm": {"name": "learned_rounding"}})
    {'scheme': 'NVFP4A16', 'algorithm': {'name': 'learned_rounding'}}
    """
    import copy

    out = copy.deepcopy(recipe)
    if "algorithm" in edit:
        algorithm = out.get("algorithm") or {}
        algorithm = {"name": algorithm} if isinstance(algorithm, str) else algorithm
        out["algorithm"] = dict(edit["algorithm"]) if "name" in edit["algorithm"] else {**algorithm, **edit["algorithm"]}
    if "observer" in edit:
        if "config_groups" not in out:
            raise ValueError("an observer edit needs config_groups in the recipe it edits")
        for group in out["config_groups"].values():
            group["weights"]["observer"] = edit["observer"]
    return out


# -- running one cell -------------------------------------------------------------------------
def run_worker(python: str, spec: dict, timeout: int) -> dict:
    """The worker in its own interpreter, one thread; its result (with its own peak RSS)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path, log_path = (Path(tmp) / n for n in ("spec.json", "result.json", "log.txt"))
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                   PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]),   # this tree's quantkit
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   # torch.compile (AutoRound's and quantkit's learned rounding) compiles in this
                   # process, its CPU time counted, into a cache of the cell's own: every cell
                   # compiles from nothing, as on a fresh machine
                   TORCHINDUCTOR_COMPILE_THREADS="1", TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / "inductor"))
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen([python, str(WORKER), str(spec_path), str(result_path)], env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                return {"error": f"not finished in {timeout} s", "wall_s": time.perf_counter() - t0,
                        "log_tail": log_path.read_text()[-3000:]}
        out = json.loads(result_path.read_text()) if result_path.exists() else {
            "error": f"exit {proc.returncode}: " + log_path.read_text()[-1500:]}
        out.setdefault("peak_rss_mib", None)   # the worker's own VmHWM (peer_workers.peak_rss_mib)
        out["wall_s"] = time.perf_counter() - t0
        if "error" in out:
            out["log_tail"] = log_path.read_text()[-3000:]
        return out


def score(base, cand_dir: Path, tok, held: list, bos, kl_max_len: int) -> dict:
    """Held-out perplexity and quantkit's mean KL over the default suite's slices."""
    sys.path.insert(0, str(HERE))
    from gptq import perplexity

    from quantkit.evaluation import SuiteOptions, evaluate
    from quantkit.evaluation.checkpoint import load_model

    cand = load_model(cand_dir)
    c0 = time.process_time()
    ppl = perplexity(cand, held, bos)
    # teacher-forced text only: multiple choice, extraction, code and generation measure other things
    options = SuiteOptions(gen_prompts=0, mc_items=0, extract_items=0, code_items=0)
    result = evaluate(base, cand, tok, suite="default", max_len=kl_max_len, options=options, progress=False)
    kls = {name: v["kl_mean"] for name, v in result.slices.items() if v.get("kl_mean") is not None}
    return {"perplexity": ppl, "kl_mean": sum(kls.values()) / len(kls), "kl_slices": kls,
            "score_cpu_s": time.process_time() - c0}


# -- results file and tables ------------------------------------------------------------------
def cell_key(r: dict) -> tuple:
    return (r["model"], r["format"], r["toolkit"], r["recipe"], r["seed"], r["samples"], r["seq_len"])


def read_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spread(values: list[float], digits: int) -> str:
    """One seed: the value; several: the mean +- half the range, and the count."""
    if not values:
        return ""
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {(max(values) - min(values)) / 2:.{digits}f} ({len(values)} seeds)"


def quote(error: str) -> str:
    """A toolkit's error as one table cell: its first line, at most 240 characters."""
    line = error.strip().splitlines()[0] if error.strip() else error
    return (line if len(line) <= 240 else line[:237] + "...").replace("`", "'")


def table(rows: list[dict], model: str) -> str:
    """The Markdown table of one model: a row per format x toolkit x recipe, seeds pooled."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["model"] == model:
            groups.setdefault((r["format"], r["toolkit"], r["recipe"]), []).append(r)
    fmt_order = {f: i for i, f in enumerate(["fp32", *FORMATS])}
    kit_order = {t: i for i, t in enumerate(["float", *TOOLKITS])}
    lines = ["| format | toolkit | recipe | perplexity | mean KL | CPU s | peak RSS MiB | note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    recipe_order = {"rtn": 0, "default": 0, "gptq": 1, "light": 1, "best": 2}   # defaults first
    for (fmt, kit, recipe), rs in sorted(groups.items(), key=lambda kv: (
            fmt_order.get(kv[0][0], 99), kit_order.get(kv[0][1], 99), recipe_order.get(kv[0][2], 3), kv[0][2])):
        ok = [r for r in rs if "perplexity" in r]
        notes = sorted({r.get("note", "") for r in rs if "error" not in r} - {""})
        errors = [r["error"] for r in rs if "error" in r]
        note = "; ".join(notes + [f"error: `{quote(e)}`" for e in errors[:1]])
        lines.append(f"| {fmt} | {kit} | {recipe} | {spread([r['perplexity'] for r in ok], 3)} | "
                     f"{spread([r['kl_mean'] for r in ok if r.get('kl_mean') is not None], 4)} | "
                     f"{spread([r['cpu_s'] for r in ok if r.get('cpu_s') is not None], 0)} | "
                     f"{spread([r['peak_rss_mib'] for r in ok if r.get('peak_rss_mib') is not None], 0)} | "
                     f"{note.replace('|', '/').replace(chr(10), ' ')} |")
    return "\n".join(lines)


def report(path: Path) -> None:
    rows = read_results(path)
    for model in dict.fromkeys(r["model"] for r in rows):
        print(f"\n{model}:\n\n{table(rows, model)}")


# -- main -------------------------------------------------------------------------------------
def shared_data(model: str, a) -> tuple[Path, dict, list, object]:
    """The model folder, the data every worker reads (calibration rows drawn with ``a.seed``,
    written once per model and seed to a file under CACHE), the held-out windows and the BOS."""
    sys.path.insert(0, str(HERE))
    from gptq import heldout_and_calibration, load_tokenizer, model_dir

    folder = model_dir(model)
    tok = load_tokenizer(folder)
    rows_file = CACHE / f"{model}-calibration-s{a.seed}-{a.samples}x{a.seq_len}.json"
    held, calib, bos = heldout_and_calibration(tok, a.eval_windows, a.seq_len, a.samples, a.seed)
    if not rows_file.exists():
        rows_file.parent.mkdir(parents=True, exist_ok=True)
        rows_file.write_text(json.dumps(calib))
    calib = json.loads(rows_file.read_text())
    return folder, {"model_dir": str(folder), "calibration": calib, "seq_len": a.seq_len}, held, bos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,gemma3", help="comma list: smollm2, gemma3, or local HF folders")
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma list of {', '.join(FORMATS)}")
    ap.add_argument("--only", help="comma list of toolkit or toolkit:recipe (toolkits: " + ", ".join(TOOLKITS) +
                    "), and float for the unquantized row (always run without --only)")
    ap.add_argument("--seed", type=int, default=0, help="the calibration rows' draw")
    ap.add_argument("--samples", type=int, default=32, help="calibration rows, shared by every toolkit")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per calibration row and held-out window")
    ap.add_argument("--eval-windows", type=int, default=10, help="held-out windows for perplexity")
    ap.add_argument("--kl-max-len", type=int, default=1024, help="longest window of the mean-KL suite")
    ap.add_argument("--timeout", type=int, default=4 * 3600, help="seconds per worker")
    ap.add_argument("--results", type=Path, default=CACHE / "results.jsonl")
    ap.add_argument("--keep", action="store_true", help="keep each cell's model folder")
    ap.add_argument("--report", action="store_true", help="print the tables of --results and stop")
    a = ap.parse_args()
    if a.report:
        report(a.results)
        return
    picks = a.only.split(",") if a.only else None
    with_float = picks is None or "float" in picks   # the fp32 row: its perplexity, KL 0
    try:
        todo = cells(a.formats.split(","), ",".join(p for p in picks if p != "float") if picks else None) \
            if picks != ["float"] else []
    except ValueError as e:
        ap.error(str(e))
    import torch

    torch.set_num_threads(1)
    for model in a.models.split(","):
        run_model(model, [("fp32", "float", "-", {})] * with_float + todo, a)
        report(a.results)


def run_model(model: str, jobs: list[tuple], a) -> None:
    """Every cell of ``jobs`` on one model that ``a.results`` does not hold yet (re-read before each
    cell: a run beside this one may have finished it), each appended to it when done."""
    from gptq import load_tokenizer

    from quantkit.evaluation.checkpoint import load_model

    folder, data, held, bos = shared_data(model, a)
    tok, base = load_tokenizer(folder), None
    common = {"model": model, "seed": a.seed, "samples": a.samples, "seq_len": a.seq_len,
              "eval_windows": a.eval_windows, "kl_max_len": a.kl_max_len}
    for fmt, toolkit, recipe, settings in jobs:
        row = {**common, "format": fmt, "toolkit": toolkit, "recipe": recipe}
        if cell_key(row) in {cell_key(r) for r in read_results(a.results)}:
            continue
        base = base if base is not None else load_model(folder)
        say(f"{model} {fmt} {toolkit}:{recipe} ...")
        if "not_offered" in settings:
            row["note"] = settings["not_offered"]
        elif toolkit == "float":
            row.update(score(base, folder, tok, held, bos, a.kl_max_len))
        else:
            row.update(run_cell(toolkit, fmt, recipe, settings, data, a))
            out_dir = Path(row.pop("out"))
            if "error" not in row:
                try:   # a failure here keeps the worker's figures and its model, for scoring again
                    row.update(score(base, out_dir, tok, held, bos, a.kl_max_len))
                except Exception as e:
                    row["error"] = f"scoring {out_dir}: {type(e).__name__}: {e}"
            if not a.keep and "error" not in row:
                shutil.rmtree(out_dir, ignore_errors=True)
        if "error" not in row:
            row.pop("traceback", None)
        say(f"{model} {fmt} {toolkit}:{recipe}: " + json.dumps(
            {k: v for k, v in row.items() if k not in ("kl_slices", "traceback", "log_tail")})[:600])
        with open(a.results, "a") as f:
            f.write(json.dumps(row) + "\n")


def run_cell(toolkit: str, fmt: str, recipe: str, settings: dict, data: dict, a) -> dict:
    """One toolkit's quantization of one format in its own interpreter; its result and the folder
    it wrote (``out``)."""
    python = sys.executable if toolkit == "quantkit" else str(ROOT / VENVS[toolkit] / "bin" / "python")
    out_dir = CACHE / "models" / f"{Path(data['model_dir']).name}-s{a.seed}-{fmt}-{toolkit}-{recipe}"
    shutil.rmtree(out_dir, ignore_errors=True)
    if not Path(python).exists():
        return {"error": f"no interpreter at {python} (see the docstring for its venv)", "out": str(out_dir)}
    spec = {**worker_spec(toolkit, fmt, settings, data), "out": str(out_dir)}
    return {**run_worker(python, spec, a.timeout), "out": str(out_dir)}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

if __name__ == "__main__":
    main()
