"""Damage planted into a written checkpoint's files, as a packing or storage fault would leave it:
a copy of the folder with one tensor changed (or removed) in its safetensors shard."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from model_factory import make_outlier_llama_dir, random_ids
from safetensors.torch import load_file, save_file

import quantkit
from quantkit.evaluation.eval_result import flagged_measures
from quantkit.evaluation.integrity import check_checkpoint
from quantkit.evaluation.verdict import GO, NOGO, REVIEW, Thresholds, decide


def _shard_of(folder: Path, key: str) -> Path:
    for f in sorted(folder.glob("*.safetensors")):
        from safetensors import safe_open
        with safe_open(f, "pt") as h:
            if key in h.keys():
                return f
    raise KeyError(key)


def plant(src: Path, dst: Path, key: str, change) -> Path:
    """Copy ``src`` to ``dst`` with tensor ``key`` replaced by ``change(tensor)`` (None: removed)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    shard = _shard_of(dst, key)
    tensors = load_file(shard)
    new = change(tensors[key].clone())
    if new is None:
        del tensors[key]
    else:
        tensors[key] = new.contiguous()
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return dst


def zero_block(t: torch.Tensor) -> torch.Tensor:
    """A block of scales zeroed: the first quarter of the rows (one head of q_proj, say)."""
    t[: max(1, t.shape[0] // 4)] = 0
    return t


def doubled(t: torch.Tensor) -> torch.Tensor:
    return t * 2


def nan_one(t: torch.Tensor) -> torch.Tensor:
    t.view(-1)[t.numel() // 2] = float("nan")
    return t


def e8m0_doubled(t: torch.Tensor) -> torch.Tensor:
    """E8M0 scales (uint8 exponents): one more in the exponent, every scale x2."""
    return t + 1


def e8m0_nan(t: torch.Tensor) -> torch.Tensor:
    """One E8M0 scale set to 255, the MX formats' NaN."""
    t.view(-1)[t.numel() // 2] = 255
    return t


def shuffled_run(t: torch.Tensor, words: int = 64, seed: int = 0) -> torch.Tensor:
    """A run of ``words`` consecutive stored elements (packed int32 words, or int8/fp8 codes ×4:
    256 bytes either way) in the middle of the tensor, permuted."""
    flat = t.view(-1) if t.dtype != torch.float8_e4m3fn else t.view(torch.uint8).view(-1)
    n = words * (4 if flat.element_size() == 1 else 1)
    start = (flat.numel() // 2) // n * n
    g = torch.Generator().manual_seed(seed)
    flat[start:start + n] = flat[start:start + n][torch.randperm(n, generator=g)]
    return t


def removed(t: torch.Tensor) -> None:
    return None


def convert_outlier_model(root: Path, recipes: dict[str, dict]) -> tuple[Path, dict[str, Path]]:
    """The outlier model (activation outliers, spread norms) and its conversion by each recipe."""
    src = make_outlier_llama_dir(root / "src", outliers=4, factor=20.0, spread=1.0)
    calib = random_ids(32, 64, vocab=256, seed=1)
    out = {}
    for name, r in recipes.items():
        recipe = {"version": 1, "calibration": {"num_samples": 32, "max_seq_len": 64}, **r}
        out[name] = quantkit.quantize(str(src), recipe, calibration=calib).save(root / name)
    return src, out


def judge(src: Path, ckpt: Path):
    """The integrity report, the verdict on it, and the slices the verdict names."""
    report = check_checkpoint(src, ckpt)
    verdict = decide(flagged_measures(report, Thresholds()))
    return report, verdict, {r.slice.removeprefix("integrity:") for r in verdict.reasons}


def assert_names_nothing(src: Path, ckpt: Path):
    """The pass on an untouched checkpoint of the tiny model: GO, nothing named, its 14 quantized
    modules checked and no other tensor reported. Returns the report."""
    report, verdict, named = judge(src, ckpt)
    assert verdict.decision == GO and not named, [r.text() for r in verdict.reasons]
    assert len(report.modules) == 14 and not report.tensors
    return report


def assert_named_alone(src: Path, bad: Path, module: str, fault: str) -> None:
    """The pass names ``module`` and nothing else, REVIEW or NO-GO; NO-GO for the faults that
    make a module's numbers unusable, and unloadable only for a missing tensor."""
    report, verdict, named = judge(src, bad)
    assert verdict.decision in (REVIEW, NOGO)
    assert named == {module}, [r.text() for r in verdict.reasons]
    assert report.unloadable == (fault == "a missing tensor")
    if fault in ("a NaN scale", "zeroed block of scales", "a missing tensor"):
        assert verdict.decision == NOGO
