"""``quantkit eval`` on families quantkit derives: an MoE whose head reads ``router_logits`` from
the body's output unconditionally (GLM-4.5), multi-head latent attention under a padding mask
(DeepSeek-V3), and a vision-language model built by its own class whose head reads the body's
image outputs (Qwen3-VL). Tiny random models with the embedded SmolLM2's tokenizer."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from families import family_config, save_random  # noqa: E402

import quantkit  # noqa: E402
from quantkit.cli import app  # noqa: E402


def _with_tokenizer(family: str, folder: Path, tokenizer_dir: Path) -> Path:
    config = family_config(family)
    config.get_text_config().vocab_size = 49152
    save_random(config, folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, folder / name)
    return folder


@pytest.mark.parametrize("family", ["GLM-4.5", "DeepSeek-V3", "Qwen3-VL"])
def test_eval_runs_on_a_derived_moe_family(family, smollm2_dir, tmp_path):
    model = _with_tokenizer(family, tmp_path / "model", smollm2_dir)
    out = quantkit.quantize(str(model), "w8a16").save(tmp_path / "out")
    result = CliRunner().invoke(app, ["eval", "--baseline", str(model), "--candidate", str(out), "--max-len", "256",
                                      "--suite", "numbers-en,long-en", "--out", str(tmp_path / "eval")])
    assert result.exit_code == 0, result.output[-600:]
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["verdict"]["decision"] in ("GO", "REVIEW", "NO-GO")
    assert set(report["verdict"]["slices"]) == {"numbers-en", "long-en"}
