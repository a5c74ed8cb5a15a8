"""vLLM's CPU build on quantkit's MoE checkpoints: tiny random Qwen3-MoE and Mixtral models.

No pretrained MoE is available offline, so this script saves two small random-initialised
models (``Qwen3MoeForCausalLM``, ``MixtralForCausalLM``: 2 layers, hidden 128, head_dim 64,
4 experts, top-2, weights N(0, 0.05) and the head N(0, 0.2), the embedded SmolLM2 tokenizer and its 49152-entry vocabulary), converts each
with quantkit (``--schemes``, default W8A8 and FP8_DYNAMIC, RTN). First vLLM (its own venv)
loads each float model and scores held-out windows, against transformers' NLL of the same ids
(vLLM's per-expert loader reads the names quantkit writes); then the checkpoints go to
``benchmarks/vllm_check.py --checkpoint``: vLLM loads each,
generates greedily and scores held-out windows; ``quantkit.load`` scores the same ids; a folder
passes when it loads, generates and ``|vLLM ppl / quantkit ppl - 1| <= --max-ratio - 1``.

Usage (main venv; vLLM installed as in vllm_check.py's docstring, e.g. in /tmp/vllmenv)::

    .venv/bin/python benchmarks/vllm_moe.py --vllm-python /tmp/vllmenv/bin/python --json out/vllm_moe.json
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))   # vllm_check's worker runner and held-out windows
ARCHS = ("Qwen3MoeForCausalLM", "MixtralForCausalLM")


def tiny_moe(arch: str, out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A random MoE of ``arch`` with the tokenizer of ``tokenizer_dir`` (vocabulary sizes match)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, MixtralConfig, Qwen3MoeConfig

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    common = dict(vocab_size=len(tok), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64, max_position_embeddings=2048, num_experts_per_tok=2,
                  tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    if arch == "Qwen3MoeForCausalLM":
        cfg = Qwen3MoeConfig(**common, intermediate_size=256, moe_intermediate_size=128, num_experts=4,
                             norm_topk_prob=True)
    else:
        cfg = MixtralConfig(**common, intermediate_size=128, num_local_experts=4)
    cfg.architectures = [arch]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():   # larger than the default init: peaked next-token distributions, so that
        for name, p in model.named_parameters():   # two readers' perplexities agree only if their weights do
            if p.ndim >= 2:
                p.normal_(0, 0.2 if name == "lm_head.weight" else 0.05)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def float_check(src: Path, args) -> bool:
    """vLLM's NLL of the float model against transformers' (per-expert weights read right)."""
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_check import PROMPTS, heldout_windows, run_worker

    windows, _ = heldout_windows(AutoTokenizer.from_pretrained(src), args.windows, args.window, "lee")
    spec = {"prompts": PROMPTS, "gen_tokens": 8, "windows": windows, "model": str(src), "dtype": "float32"}
    v = run_worker(args.vllm_python, "vllm", spec, timeout=900, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    model = AutoModelForCausalLM.from_pretrained(src).eval()
    nll = 0.0
    with torch.no_grad():
        for w in windows:
            x = torch.tensor([w])
            nll += float(F.cross_entropy(model(input_ids=x).logits[0, :-1].float(), x[0, 1:], reduction="sum"))
    ok = "nll" in v and abs(v["nll"] / nll - 1) <= 1e-4
    print(f"{src.name} float32: vLLM nll {v.get('nll')} ({v.get('stage')}; {v.get('error', '')[:300]}), "
          f"transformers nll {nll:.4f} over {sum(len(w) - 1 for w in windows)} tokens: {'PASS' if ok else 'FAIL'} "
          f"(relative difference <= 1e-4)", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--workdir", default=str(ROOT / "out" / "vllm_moe"))
    ap.add_argument("--schemes", nargs="+", default=["W8A8", "FP8_DYNAMIC"])
    ap.add_argument("--ignore", nargs="*", default=[],
                    help="more modules kept in high precision, e.g. 're:.*experts.*' (attention only quantized)")
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--max-ratio", type=float, default=1.01)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-checkpoints", action="store_true", help="only the float models' check")
    args = ap.parse_args()

    import quantkit
    from quantkit.inputs.embedded_model import default_model_dir

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    folders, failed = [], 0
    for arch in ARCHS:
        src = tiny_moe(arch, work / arch, default_model_dir())   # quantkit.load reads checkpoints only
        failed += not float_check(src, args)
        for scheme in args.schemes:
            out = work / f"{arch}-{scheme}{'-kept' if args.ignore else ''}"
            shutil.rmtree(out, ignore_errors=True)
            q = quantkit.quantize(src, {"scheme": scheme, "ignore": ["lm_head", *args.ignore]},
                                  options=quantkit.ConvertOptions(log=print))
            folders.append(q.save(out))
    if args.no_checkpoints:
        return int(failed > 0)
    cmd = [sys.executable, str(HERE / "vllm_check.py"), "--checkpoint", *map(str, folders),
           "--vllm-python", args.vllm_python, "--windows", str(args.windows), "--window", str(args.window),
           "--max-ratio", str(args.max_ratio), "--gen-tokens", "8"]
    if args.json:
        cmd += ["--json", args.json]
    return subprocess.run(cmd).returncode or int(failed > 0)


if __name__ == "__main__":
    sys.exit(main())
