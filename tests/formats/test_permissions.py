"""Written folders and files get the modes a plain mkdir/open gives under the umask, not the
0700 / 0600 of ``tempfile.mkdtemp`` and safetensors: a serving process running as another
user must be able to read a checkpoint, and a person the report."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from model_factory import make_llama_dir, save_byte_tokenizer
from quantkit.common.outputs import current_umask, ordinary_permissions


@pytest.fixture(params=[0o022, 0o027], ids=["umask022", "umask027"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    m = make_llama_dir(tmp_path_factory.mktemp("perm") / "model", vocab=260)
    return save_byte_tokenizer(m)


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def expected(root: Path, mask: int) -> dict[str, int]:
    return {str(p.relative_to(root)): (0o777 if p.is_dir() else 0o666) & ~mask for p in [root, *root.rglob("*")]}


def test_current_umask_reads_without_changing_it(umask):
    assert current_umask() == umask and current_umask() == umask


def test_checkpoint_follows_the_umask(model, tmp_path, umask):
    import quantkit

    out = quantkit.quantize(str(model), "w8a16").save(tmp_path / "ckpt")
    got = modes(out)
    assert "model.safetensors" in got and got == expected(out, umask)


def test_eval_report_follows_the_umask(model, tmp_path, umask):
    import quantkit
    from quantkit.workflows.evaluate import evaluate_paths

    ckpt = quantkit.quantize(str(model), "w8a16").save(tmp_path / "ckpt")
    options = {"text_items": 1, "mc_items": 1, "extract_items": 1, "code_items": 0, "gen_prompts": 0,
               "item_tokens": 32}
    result = evaluate_paths(model, ckpt, suite="numbers-en", max_len=64, eval_section={"options": options},
                            progress=False)
    report = result.save(tmp_path / "report")
    got = modes(report)
    assert "report.json" in got and got == expected(report, umask)


def test_ordinary_permissions_opens_a_private_tree(tmp_path, umask):
    root = tmp_path / "t"
    (root / "sub").mkdir(parents=True, mode=0o700)
    (root / "sub" / "f").write_text("x")
    os.chmod(root / "sub" / "f", 0o600)
    os.chmod(root, 0o700)
    ordinary_permissions(root)
    assert modes(root) == expected(root, umask)
