"""The sha256 of every tensor quantkit writes for a recipe on a tiny seeded Llama, by tensor name
(whatever the shard layout): ``python tensor_digests.py OUT.json`` with the package under test
first on ``sys.path``. Run in a process of its own with one thread: round-to-nearest recipes are
elementwise and max reductions, whose bits do not depend on the host, so the digests of one
version of quantkit must equal another's when the behaviour is unchanged."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

RECIPES = ("w8a16", "w4a16-g64", "w4a16-asym", "fp8-dynamic", "w8a8")


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


def main(target: str) -> None:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: model_factory
    import quantkit
    from model_factory import make_llama_dir

    with tempfile.TemporaryDirectory() as box:
        model = make_llama_dir(Path(box) / "model", num_layers=2, hidden=128, intermediate=256, seed=7)
        result = {}
        for recipe in RECIPES:
            out = Path(box) / recipe
            quantkit.quantize(str(model), recipe).save(out)
            result[recipe] = digests(out)
    Path(target).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
