"""Experts a checkpoint stores fused under names transformers renames on load: Granite 4 stores
``block_sparse_moe.input_linear.weight`` ``[E, 2 x inter, hidden]`` and ``output_linear.weight``
for the module's ``block_sparse_moe.experts.gate_up_proj`` / ``down_proj`` (transformers'
conversion mapping renames them) and its router one module deeper (``router.layer.weight``).

quantkit renames, then reads each expert out of the fused tensors (``pipeline/fused_experts.py``)
and writes it per expert (``block_sparse_moe.experts.<e>.gate_proj|up_proj|down_proj``), the names
vLLM's Granite 4 loader maps quantized experts from (``get_expert_mapping``); the router goes back
under its stored name. ``quantkit.load`` reads the output. Plain transformers 5.24 does not: its
mapping renames the fused names only, so it reports the experts missing (docs/PLATFORM.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from families import family_config, make_family_dir  # noqa: E402

import quantkit  # noqa: E402
from quantkit.arch.meta import auto_class  # noqa: E402

GRANITE = "Granite 4 (Mamba hybrid)"


def _rtn_int8_reference(folder: Path):
    """The float model with every decoder linear (the router's kept) and every expert rounded per
    output channel to int8 (absmax / 127.5) by a plain reference on transformers' own modules."""
    model = auto_class(family_config(GRANITE)).from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and name.startswith("model.layers."):
                s = m.weight.abs().amax(dim=1, keepdim=True) / 127.5
                m.weight.copy_(torch.clamp(torch.round(m.weight / s), -128, 127) * s)
            if isinstance(getattr(m, "gate_up_proj", None), torch.Tensor):
                for w in (m.gate_up_proj, m.down_proj):     # [E, out, in]
                    s = w.abs().amax(dim=2, keepdim=True) / 127.5
                    w.copy_(torch.clamp(torch.round(w / s), -128, 127) * s)
    return model


def test_granite_4_experts_stored_fused_convert_per_expert_and_read_back(tmp_path):
    """W8A16 read back by ``quantkit.load`` equals the plain int8 reference (measured equal: the
    same products in the same order); stored names kept where the module has them, the config's
    ``time_step_limit`` ``[0, inf]`` written as transformers writes it."""
    torch.set_num_threads(1)
    folder = make_family_dir(GRANITE, tmp_path / "model")
    out = quantkit.quantize(str(folder), "w8a16").save(tmp_path / "out")
    stored = load_file(str(out / "model.safetensors"))
    assert "model.layers.1.block_sparse_moe.experts.3.down_proj.weight_packed" in stored
    assert not any("input_linear.weight" in k and "block_sparse_moe" in k for k in stored)
    assert stored["model.layers.1.block_sparse_moe.router.layer.weight"].dtype == torch.float32
    config = json.loads((out / "config.json").read_text())
    assert config["time_step_limit"] == [0.0, {"__float__": "Infinity"}]
    ids = torch.randint(1, 256, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = _rtn_int8_reference(folder)(input_ids=ids).logits
        got = quantkit.load(out)(input_ids=ids).logits
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()
    _, info = auto_class(family_config(GRANITE)).from_pretrained(out, dtype="auto", output_loading_info=True)
    assert "model.layers.1.block_sparse_moe.experts.gate_up_proj" in info["missing_keys"]
