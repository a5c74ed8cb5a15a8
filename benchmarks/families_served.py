"""Each family's converted checkpoint evaluated by ``quantkit eval`` and served by vLLM's CPU build.

The families of ``benchmarks/families.py`` (tiny random models from transformers' config
classes), built with the embedded SmolLM2's tokenizer and its 49152-entry vocabulary so that
the evaluation suite and the engine can tokenize. Each is converted with ``quantkit convert
--recipe w4a16-g64-gptq`` (its default calibration set; the conversion runs the evaluation and
prints its verdict), then ``benchmarks/vllm_check.py --checkpoint`` loads the output in vLLM
(float32, retried in bfloat16 where the CPU WNA16 kernel has no float32 path), generates and
scores held-out windows against ``quantkit.load``. A random model's verdict means nothing; what
is measured is that the evaluation runs and that the engine loads, generates and agrees.

Usage (main venv; vLLM in .venv-vllm, see vllm_check.py)::

    .venv/bin/python benchmarks/families_served.py --out out/families_served.json --markdown out/families_served.md
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
RECIPE = "w4a16-g64-gptq"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def _family_dir(family: str, folder: Path) -> Path:
    from families import family_config, save_random

    from quantkit.inputs.embedded_model import default_model_dir

    config = family_config(family)
    config.get_text_config().vocab_size = 49152
    config.get_text_config().max_position_embeddings = 2048   # vllm_check serves 1024 tokens
    if hasattr(config, "vocab_size"):
        config.vocab_size = 49152
    save_random(config, folder)
    for name in _TOKENIZER_FILES:
        if (default_model_dir() / name).exists():
            shutil.copy(default_model_dir() / name, folder / name)
    return folder


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and "it/s]" not in ln]
    return lines[-1][:240] if lines else ""


def _row(family: str, work: Path, vllm_python: str) -> dict:
    model, out = _family_dir(family, work / "model"), work / "out"
    conv = subprocess.run([str(ROOT / ".venv/bin/quantkit"), "convert", str(model), "--recipe", RECIPE,
                           "--out", str(out)], capture_output=True, text=True, timeout=3600)
    row: dict = {"family": family, "convert_rc": conv.returncode}
    if conv.returncode != 0:
        row["convert_error"] = _last_line(conv.stderr)
        return row
    report = out / "eval" / "report.json"
    row["eval"] = json.loads(report.read_text())["verdict"]["decision"] if report.exists() else "no report"
    check = subprocess.run([sys.executable, str(ROOT / "benchmarks/vllm_check.py"), "--checkpoint", str(out),
                            "--vllm-python", vllm_python, "--windows", "2", "--window", "128", "--gen-tokens", "4",
                            "--json", str(work / "vllm.json"), "--workdir", str(work / "vllm")],
                           capture_output=True, text=True, timeout=3600)
    row["vllm_rc"] = check.returncode
    row["vllm"] = _vllm_summary(work / "vllm.json", check)
    return row


def _vllm_summary(path: Path, check: subprocess.CompletedProcess) -> str:
    """What vLLM said: that it serves, or its own last error line (vllm_check prints each engine's
    record, ``error_lines`` among them)."""
    if check.returncode == 0:
        return "serves; perplexity within 1% of quantkit.load"
    for line in reversed(check.stdout.splitlines()):
        record = line.partition("): ")[2].strip()
        if "'error_lines'" not in record:
            continue
        try:
            lines = ast.literal_eval(record).get("error_lines") or []
        except (ValueError, SyntaxError):
            continue
        if lines:
            return lines[-1].rpartition("] ")[2][:240]
    return _last_line(check.stdout + check.stderr)


def main() -> None:
    from families import FAMILIES, VISION_FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm/bin/python"))
    parser.add_argument("--only", nargs="*", help="families to run (default: all)")
    args = parser.parse_args()
    rows = []
    for family in [*FAMILIES, *VISION_FAMILIES]:
        if args.only and family not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(_row(family, Path(tmp), args.vllm_python))
        print(json.dumps(rows[-1]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
    if args.markdown:
        lines = ["| family | quantkit eval (W4A16 GPTQ g64) | vLLM CPU build |", "|---|---|---|"]
        for r in rows:
            ev = r.get("eval") or f"convert refused: {r.get('convert_error', '')}"
            lines.append(f"| {r['family']} | {ev} | {r.get('vllm', '-')} |")
        args.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
