"""The sha256 of every tensor quantkit writes for a recipe on a tiny seeded model, by tensor name
(whatever the shard layout): ``python tensor_digests.py OUT.json [rtn|gptq]`` with the package
under test first on ``sys.path``. Run in a process of its own with one thread.

``rtn``: round-to-nearest recipes are elementwise and max reductions, whose bits do not depend
on the host, so the digests of one version of quantkit must equal another's when the behaviour
is unchanged. ``gptq``: the shipped GPTQ recipes, plus the settings that reach the solve's other
paths on a tiny model (static groups, several batches in lockstep, one layer pass per sub-group,
experts that no token reaches); their matmuls and Cholesky factorisations run on one thread in
a fixed order, so on one machine two runs give the same bits. GPTQ cases also digest each
module's entry of ``quantization_log.json`` (the solve's losses and damping, as reported).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

RECIPES = ("w8a16", "w4a16-g64", "w4a16-asym", "fp8-dynamic", "w8a8")

#: Shipped recipes that run GPTQ, each reaching a different branch of the solve or the schedule.
GPTQ_RECIPES = ("w4a16-g64-gptq", "w4a16-gptq", "w4a16-g64-gptq-no-actorder", "w4a16-g64-gptq-actorder-group",
                "w4a16-g64-gptq-no-true-sequential", "w4a16-asym-gptq", "w8a16-gptq", "w8a8-gptq",
                "awq-gptq-w4a16-g64", "w8a8-smoothquant-gptq")

_G64 = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                           "group_size": 64, "actorder": "weight", "observer": "mse"}}

#: name: (recipe, positions per calibration row or None for the default, a MoE model or the Llama)
GPTQ_SETTINGS = {
    # group qparams from the original weight, fixed before the solve
    "static-groups": ({"config_groups": {"group_0": _G64}, "ignore": ["lm_head"],
                       "algorithm": {"name": "gptq", "static_groups": True}}, None, False),
    # five calibration batches, all in one pass: each linear solved when every batch reaches it
    "lockstep": ("w4a16-g64-gptq", 40, False),
    # batches too many for one pass: the layer re-run once per sub-group (Hessians offloaded)
    "reruns": ({"config_groups": {"group_0": _G64}, "ignore": ["lm_head"],
                "algorithm": {"name": "gptq", "offload_hessians": True},
                "calibration": {"batch_tokens": 40}}, None, False),
    # experts 2 and 3 never routed (no token, H = I), the others stacked with their siblings
    "moe-starved": ({"scheme": "W4A16", "group_size": 32, "algorithm": "gptq",
                     "calibration": {"moe_experts": "routed", "moe_min_tokens": 8}}, None, True),
    "moe-starved-lockstep": ({"scheme": "W4A16", "group_size": 32, "algorithm": "gptq",
                              "calibration": {"moe_experts": "routed", "moe_min_tokens": 8}}, 40, True),
}


def digests(folder: Path) -> dict[str, str]:
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                t = h.get_tensor(name).contiguous()
                out[name] = f"{t.dtype}:{tuple(t.shape)}:" + hashlib.sha256(t.view(-1).view(
                    __import__("torch").uint8).numpy().tobytes()).hexdigest()
    return dict(sorted(out.items()))


def module_log_digests(folder: Path) -> dict[str, str]:
    """Per quantized module, the sha256 of its ``quantization_log.json`` entry (keys in order, floats as written)."""
    modules = json.loads((folder / "quantization_log.json").read_text())["modules"]
    return {f"log:{name}": hashlib.sha256(json.dumps(entry).encode()).hexdigest()
            for name, entry in sorted(modules.items())}


def calibration_samples() -> list[list[int]]:
    """Eight token-id samples of uneven lengths (packed several to a row), 180 tokens in all."""
    import torch

    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (40, 9, 23, 31, 14, 40, 6, 17)]


def rtn_digests(box: Path, model: Path) -> dict[str, dict[str, str]]:
    import quantkit

    result = {}
    for recipe in RECIPES:
        out = box / recipe
        quantkit.quantize(str(model), recipe).save(out)
        result[recipe] = digests(out)
    return result


def gptq_case(model: Path, recipe, row_tokens: int | None, out: Path) -> dict[str, str]:
    import quantkit
    from quantkit.pipeline import batches

    default = batches.MICRO_BATCH_TOKENS
    if row_tokens is not None:
        batches.MICRO_BATCH_TOKENS = row_tokens
    try:
        quantkit.quantize(str(model), recipe, calibration=calibration_samples()).save(out)
    finally:
        batches.MICRO_BATCH_TOKENS = default
    return {**digests(out), **module_log_digests(out)}


def gptq_digests(box: Path, model: Path) -> dict[str, dict[str, str]]:
    from moe_models import make_moe_dir

    moe = make_moe_dir(box / "moe", "MixtralForCausalLM", starve=True)
    result = {recipe: gptq_case(model, recipe, None, box / recipe) for recipe in GPTQ_RECIPES}
    for name, (recipe, row_tokens, on_moe) in GPTQ_SETTINGS.items():
        result[name] = gptq_case(moe if on_moe else model, recipe, row_tokens, box / name)
    return result


def main(target: str, suite: str = "rtn") -> None:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: model_factory
    from model_factory import make_llama_dir

    with tempfile.TemporaryDirectory() as box:
        model = make_llama_dir(Path(box) / "model", num_layers=2, hidden=128, intermediate=256, seed=7)
        result = {"rtn": rtn_digests, "gptq": gptq_digests}[suite](Path(box), model)
    Path(target).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
