"""Resuming a killed conversion from its last complete layer, with an uninterrupted run's bytes.

A conversion for an output folder keeps its bookkeeping in the staging folder's ``.run/``
(``formats.staging``), all of it removed before the folder is renamed into place:

- ``manifest.json``: the run's keys and the state at its last layer boundary, replaced
  atomically (written, then renamed) once each layer is written;
- ``state-NNNNN.safetensors``: the calibration hidden states entering layer NNNNN, one
  tensor per batch, and torch's RNG state;
- ``part-NNNNN.safetensors``: tensors of finished layers not yet in a shard (the writer
  flushes a shard only every ~64 MiB; until then they are only in memory);
- ``activations/``: with ``calibration.offload``, the offloaded hidden states; the files of
  the committed generation are the snapshot (the next layer writes the other parity).

The keys, compared on ``--resume``; any difference starts afresh and says which one:
recipe (sha256 of ``Recipe.to_dict()``, the normalised form the log records: every key,
override and default), source (``config.json`` as transformers parsed it; per shard its
size, mtime in ns and the sha256 of its safetensors header: a full hash would read every
shard, 0.5 GB to 140 GB, at each start, while any tool that rewrites a shard changes its
mtime, and the header pins every tensor's name, dtype, shape and offsets; an in-memory model
is hashed in full), calibration (sha256 of the token ids), quantkit's version and the sha256
of its code outside ``evaluation/`` (a development checkout changes without a new version),
torch, transformers, the device and torch's thread count (CPU reductions are split by it).

Why the hidden states are saved rather than recomputed by replaying the finished layers
from their written weights: a safetensors round trip gives back the very bits, so the resumed
run feeds layer N exactly what the uninterrupted run fed it by construction. A replay would
be bit-exact only if unpacking and dequantizing the written codes reproduced the weights the
layer ran with, and a sequential pass reproduced the lockstep pass GPTQ propagated from, for
every step and format. The cost is one write of the calibration activations per layer (the
state of the previous boundary is deleted): on SmolLM2 GPTQ with 128 x 512 calibration tokens,
about 83 MB a layer and 2.0% of the run (``benchmarks/resume_overhead.py``); with offload they
are on disk already and nothing extra is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from quantkit.formats import staging
from quantkit.formats.staging import RUN_DIR
from quantkit.common.jsonio import dumps_strict
from quantkit import __version__

MANIFEST = "manifest.json"
FORMAT = 1
_LAYER_FILE = re.compile(r"^layer-\d{5}\.")
ACTIVATIONS = "activations"   # the offloaded hidden states, inside RUN_DIR


# -- the keys ------------------------------------------------------------------------------

def run_keys(recipe, config, source, samples: list[list[int]] | None, device: str) -> dict[str, Any]:
    """What must not change for a resumed run to give the bytes of an uninterrupted one."""
    import transformers


    return {
        "recipe": _sha256(json.dumps(recipe.to_dict(), sort_keys=True, separators=(",", ":"), default=str)),
        "source": source_key(config, source),
        "calibration": calibration_key(samples),
        "quantkit": __version__,
        "code": code_key(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "threads": torch.get_num_threads(),
    }


def source_key(config, source) -> dict[str, str]:
    key = {"config.json": _sha256(config.to_json_string())}
    if hasattr(source, "files"):
        for f in source.files():
            st = f.stat()
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                header = fh.read(n)
            key[f.name] = f"{st.st_size}:{st.st_mtime_ns}:{_sha256(header)}"
    else:  # an in-memory model: no file to fingerprint, so every tensor's bytes
        h = hashlib.sha256()
        for name in sorted(source.keys()):
            t = source.get(name).detach().cpu().contiguous()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        key["state_dict"] = h.hexdigest()
    return key


def calibration_key(samples: list[list[int]] | None) -> dict[str, Any]:
    samples = samples or []
    return {"sha256": _sha256(json.dumps(samples, separators=(",", ":"))), "samples": len(samples),
            "tokens": sum(len(s) for s in samples)}


def code_key() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if not rel.startswith("evaluation/"):
            h.update(rel.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def mismatch(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """The first key that differs, as a phrase; None when all agree."""
    for k, v in new.items():
        was = old.get(k)
        if was == v:
            continue
        if k == "recipe":
            return "the recipe differs (a key, an override or a default changed)"
        if k == "source":
            changed = sorted(n for n in set(v) | set(was or {}) if (was or {}).get(n) != v.get(n))
            return f"the model changed ({', '.join(changed)}: size, mtime or header)"
        if k == "calibration":
            return (f"the calibration set differs ({v['samples']} samples, {v['tokens']} tokens; "
                    f"the interrupted run had {(was or {}).get('samples')}, {(was or {}).get('tokens')})")
        if k == "code":
            return "quantkit's code changed since the interrupted run"
        if k == "threads":
            return f"torch uses {v} threads, the interrupted run {was} (CPU reductions depend on it)"
        return f"{k} is {v}, the interrupted run's was {was}"
    return None


def _sha256(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


# -- the state at a layer boundary ---------------------------------------------------------

@dataclass
class LayerLog:
    """What the layers add to quantization_log.json, carried across a restart."""
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)      # per module
    transforms: dict[str, dict[str, Any]] = field(default_factory=dict)  # per layer, per step
    groups: list[str] = field(default_factory=list)                      # config groups used, first use first
    formats: dict[str, int] = field(default_factory=dict)                # modules per format
    experts: dict[str, dict[str, Any]] = field(default_factory=dict)     # MoE coverage per experts module


@dataclass
class Boundary:
    """The committed state after ``layers_done`` layers."""
    layers_done: int
    num_layers: int
    batch_tokens: int | None      # what the calibration batches were cut with (may come from free memory)
    batches: int                  # calibration batches (0 without calibration)
    writer: dict                  # ShardWriter.state()
    log: LayerLog
    state: str                    # the state file's name

    @classmethod
    def from_json(cls, d: dict) -> "Boundary":
        return cls(**{**d, "log": LayerLog(**d["log"])})


class RunBook:
    """The bookkeeping of one resumable run in ``folder`` (a staging folder).

    ``resumed``: the boundary this run continues from (None: a fresh run).
    """

    def __init__(self, folder: Path, keys: dict[str, Any], resumed: Boundary | None = None):
        self.folder, self.keys, self.resumed = Path(folder), keys, resumed
        self.last: Boundary | None = resumed

    @property
    def run_dir(self) -> Path:
        return self.folder / RUN_DIR

    @property
    def layers_done(self) -> int:
        return self.last.layers_done if self.last else 0

    def commit(self, layers_done: int, num_layers: int, writer, hidden, log: LayerLog,
               batch_tokens: int | None) -> None:
        """Record the boundary after ``layers_done`` layers (``writer``'s shards hold them)."""
        from safetensors.torch import save_file

        run = self.run_dir
        writer.save_pending(run)
        tensors = {"rng.cpu": torch.get_rng_state()}
        if self.keys["device"].startswith("cuda") and torch.cuda.is_available():
            tensors["rng.cuda"] = torch.cuda.get_rng_state(torch.device(self.keys["device"]))
        held = hidden.in_memory() if hidden is not None and layers_done > 0 else None
        for j, t in enumerate(held or []):   # layer 0's inputs are recaptured: not saved
            tensors[f"hidden.{j:06d}"] = t.detach().contiguous().cpu()
        state = f"state-{layers_done:05d}.safetensors"
        save_file(tensors, str(run / state))
        b = Boundary(layers_done, num_layers, batch_tokens, hidden.count if hidden is not None else 0,
                     writer.state(), log, state)
        tmp = run / f".{MANIFEST}.tmp"
        tmp.write_text(dumps_strict({"format": FORMAT, "keys": self.keys, "boundary": asdict(b)}), encoding="utf-8")
        os.replace(tmp, run / MANIFEST)   # the commit point
        self.last = b
        for p in run.glob("state-*.safetensors"):
            if p.name != state:
                p.unlink(missing_ok=True)
        for p in run.glob("part-*.safetensors"):
            if p.name not in b.writer["parts"]:
                p.unlink(missing_ok=True)   # flushed into a shard

    def hidden_states(self, device: str) -> list[torch.Tensor]:
        """The resumed boundary's hidden states, in fresh allocations (as a live run holds them)."""
        from safetensors.torch import load_file

        saved = load_file(str(self.run_dir / self.resumed.state))
        return [saved[f"hidden.{j:06d}"].to(device).clone() for j in range(self.resumed.batches)]

    def restore_rng(self) -> None:
        from safetensors.torch import load_file

        saved = load_file(str(self.run_dir / self.resumed.state))
        torch.set_rng_state(saved["rng.cpu"])
        if "rng.cuda" in saved and torch.cuda.is_available():
            torch.cuda.set_rng_state(saved["rng.cuda"], torch.device(self.keys["device"]))


def read_boundary(folder: Path) -> tuple[dict[str, Any], Boundary] | str:
    """A staging folder's keys and last boundary, or why it cannot be continued."""
    try:
        m = json.loads((Path(folder) / RUN_DIR / MANIFEST).read_text(encoding="utf-8"))
        if m.get("format") != FORMAT:
            return f"its manifest has format {m.get('format')}, not {FORMAT}"
        return m["keys"], Boundary.from_json(m["boundary"])
    except FileNotFoundError:
        return "it holds no manifest (killed before its first layer boundary)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its manifest is unreadable ({type(e).__name__})"


def prune(folder: Path, b: Boundary, offload: bool) -> str | None:
    """Delete what ``b`` does not account for (work after the boundary); None, or what is missing."""
    folder = Path(folder)
    run = folder / RUN_DIR
    shards = {name for name, _ in b.writer["shards"]}
    needed = [folder / n for n in shards] + [run / p for p in b.writer["parts"]] + [run / b.state]
    if offload and b.layers_done > 0:
        needed += [run / ACTIVATIONS / f"hidden-{b.layers_done % 2}-{j:06d}.safetensors" for j in range(b.batches)]
    missing = [p for p in needed if not p.is_file()]
    if missing:
        return f"its last boundary's {missing[0].relative_to(folder)} is missing"
    for p in folder.iterdir():
        if p.name == RUN_DIR:
            continue
        if p.is_dir():   # per-layer records (transforms/, integrity/): layer-NNNNN.<ext>
            for t in p.iterdir():
                if not (_LAYER_FILE.match(t.name) and int(t.name[6:11]) < b.layers_done):
                    staging.remove(t) if t.is_dir() else t.unlink()
        elif p.name not in shards:
            p.unlink()
    keep = {MANIFEST, staging.OWNER_FILE, ACTIVATIONS, b.state, *b.writer["parts"]}
    for p in run.iterdir():
        if p.name not in keep:
            staging.remove(p) if p.is_dir() else p.unlink()
    return None


# -- finding the run to continue -----------------------------------------------------------

def open_run(parent: Path, out: Path, keys: dict[str, Any], resume: bool, offload: bool,
             say: Callable[[str], None], warn: Callable[[str], None]) -> RunBook:
    """The RunBook for a run of ``out``: a dead run's folder continued (``resume``) or a new one.

    Dead runs' folders for ``out`` not continued are removed, and so are dead folders no run
    can continue (no manifest or no output recorded); a live run's folder is never touched.
    ``say`` gets what was done; ``warn`` why a requested resume starts afresh (the caller
    records its warnings in quantization_log.json).
    """
    out = Path(out).resolve()
    mine: list[tuple[Path, tuple[dict, Boundary] | str]] = []
    for folder, owner in staging.dead_folders(parent):
        if owner.out == str(out):
            mine.append((folder, read_boundary(folder)))
        elif owner.out is None or not (folder / RUN_DIR / MANIFEST).exists():
            staging.remove(folder)
            say(f"removed {folder}: the staging folder of a dead run (pid {owner.pid}) that cannot be resumed")
    # the furthest-along readable one is the run to continue
    mine.sort(key=lambda m: -1 if isinstance(m[1], str) else m[1][1].layers_done)
    if resume and mine:
        folder, found = mine.pop()
        reason = found if isinstance(found, str) else mismatch(found[0], keys)
        if reason is None:
            try:   # an atomic rename: of two runs resuming at once, one gets it
                folder = staging.claim(folder, out)
            except OSError:
                reason = "another run took its staging folder first"
        if reason is None:
            reason = prune(folder, found[1], offload)
        if reason is None:
            for other, _ in mine:
                staging.remove(other)
            b = found[1]
            say(f"resume: continuing {folder.name} after {b.layers_done} of {b.num_layers} layers")
            return RunBook(folder, keys, b)
        warn(f"resume: starting afresh: {reason} (removed {folder.name})")
        staging.remove(folder)
    elif resume:
        warn(f"resume: no interrupted run of {out} to continue; starting afresh")
    for folder, found in mine:
        staging.remove(folder)
        if not isinstance(found, str) and found[1].layers_done > 0:
            b = found[1]
            say(f"removed {folder.name}, an interrupted run of {out} ({b.layers_done} of {b.num_layers} "
                "layers done; --resume would have continued it)")
    return RunBook(staging.make_folder(parent, out=out), keys)
