"""Llama 4: experts held transposed and called with routed copies of every token (its family file
``arch/families/llama4.py``). The text model and the multimodal wrapper convert; the W8A16 output,
read back by ``quantkit.load``, computes what the float model computes with its decoder linears and
its experts rounded to int8 by a plain reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from families import family_config, save_random  # noqa: E402

import quantkit  # noqa: E402
from quantkit.arch.lookup import arch_for  # noqa: E402
from quantkit.arch.meta import auto_class  # noqa: E402

_IDS = [[int(t) for t in torch.randint(1, 256, (48,), generator=torch.Generator().manual_seed(i))] for i in range(6)]


def _round_columns(w: torch.Tensor) -> None:
    """Each column of ``w`` ``[in, out]`` (one output of a transposed linear) to int8, in place."""
    scale = w.abs().amax(dim=0, keepdim=True) / 127.5
    w.copy_(torch.clamp(torch.round(w / scale), -128, 127) * scale)


def _reference(model, keep: tuple[str, ...]) -> None:
    """The float model with every decoder linear (routers and scalar gates kept) and every expert's
    linears rounded per output channel, in place."""
    layers = arch_for(model.config)[1].layers + "."
    with torch.no_grad():
        for name, m in model.named_modules():
            if not name.startswith(layers):
                continue
            if isinstance(m, torch.nn.Linear) and not name.endswith(keep):
                scale = m.weight.abs().amax(dim=1, keepdim=True) / 127.5
                m.weight.copy_(torch.clamp(torch.round(m.weight / scale), -128, 127) * scale)
            gate_up, down = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
            if isinstance(gate_up, torch.Tensor) and gate_up.ndim == 3:
                inter = down.shape[1]
                for e in range(gate_up.shape[0]):
                    _round_columns(gate_up[e, :, :inter])
                    _round_columns(gate_up[e, :, inter:])
                    _round_columns(down[e])


@pytest.mark.parametrize("family", ["Llama 4 (text)", "Llama 4 (multimodal)"])
def test_llama4_w8a16_reads_back_as_the_int8_reference(family, tmp_path):
    torch.set_num_threads(1)
    config = family_config(family)
    config.architectures = config.architectures or ["Llama4ForCausalLM"]
    folder = save_random(config, tmp_path / "model")
    out = quantkit.quantize(str(folder), "w8a16").save(tmp_path / "out")
    ref = auto_class(config).from_pretrained(folder, dtype=torch.float32)
    spec = arch_for(ref.config)[1]
    assert spec.moe is not None and spec.moe.call == "routed_copies" and "feed_forward.router" in spec.keep
    _reference(ref, tuple("." + k for k in spec.keep))
    got = quantkit.load(out)
    x = torch.tensor([_IDS[0]])
    with torch.no_grad():
        a, b = ref(input_ids=x).logits, got(input_ids=x).logits
    assert (a - b).abs().max() <= 1e-4 * a.abs().max(), family


def test_llama4_gptq_beats_round_to_nearest_on_its_calibration_rows(tmp_path):
    torch.set_num_threads(1)
    config = family_config("Llama 4 (text)")
    config.architectures = ["Llama4ForCausalLM"]
    folder = save_random(config, tmp_path / "model")
    ref = auto_class(config).from_pretrained(folder, dtype=torch.float32)
    errors = {}
    for recipe in ("w4a16-g64", "w4a16-g64-gptq"):
        got = quantkit.load(quantkit.quantize(str(folder), recipe, calibration=_IDS).save(tmp_path / recipe))
        with torch.no_grad():
            errors[recipe] = sum(float((ref(input_ids=torch.tensor([i])).logits
                                        - got(input_ids=torch.tensor([i])).logits).pow(2).mean()) for i in _IDS[:4])
    assert errors["w4a16-g64-gptq"] < errors["w4a16-g64"], errors
