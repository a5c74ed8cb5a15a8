"""What the pipeline reads and keeps outside its layers: source tensors, offloaded call arguments."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from quantkit.pipeline.store import ArgumentStore
from quantkit.inputs.source import SafetensorsSource


def test_source_reads_every_dtype_into_memory_of_its_own(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"f32": torch.randn(3, 4, generator=g), "f16": torch.randn(5, generator=g).half(),
               "bf16": torch.randn(2, 3, generator=g).bfloat16(), "scalar": torch.tensor(3),
               "empty": torch.zeros(0, 4), "i8": torch.arange(-8, 8, dtype=torch.int8),
               "fp8": torch.randn(4, generator=g).to(torch.float8_e4m3fn), "bool": torch.tensor([True, False]),
               "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    source = SafetensorsSource(tmp_path)
    for name, t in tensors.items():
        got = source.get(name)
        assert got.dtype == t.dtype and got.shape == t.shape, name
        assert torch.equal(got.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name
        # its own allocation, not a view of a file map (which would keep the map resident)
        assert got.untyped_storage().nbytes() == t.numel() * t.element_size()
    source.close()


def test_offloaded_call_arguments_come_back_equal_and_shared_tensors_are_saved_once(tmp_path):
    mask = torch.rand(2, 1, 8, 8) > 0.5
    cos, sin = torch.randn(2, 8, 4), torch.randn(2, 8, 4)
    calls = [((), {"attention_mask": mask, "position_embeddings": (cos, sin), "use_cache": False, "cache": None})
             for _ in range(3)]   # three layers, one mask and one rotary table, as a model's forward makes them
    store = ArgumentStore(tmp_path)
    store.append(calls)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "args-000000.safetensors"), "pt") as f:
        assert len(list(f.keys())) == 3
    for i in range(3):
        args, kwargs = store.get(i, 0)
        assert args == () and kwargs["use_cache"] is False and kwargs["cache"] is None
        assert torch.equal(kwargs["attention_mask"], mask)
        assert isinstance(kwargs["position_embeddings"], tuple)
        assert all(torch.equal(a, b) for a, b in zip(kwargs["position_embeddings"], (cos, sin)))
    in_memory = ArgumentStore()
    in_memory.append(calls)
    assert in_memory.get(1, 0)[1]["attention_mask"] is mask
