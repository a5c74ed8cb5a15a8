"""A model-free conversion of a checkpoint over 3x a memory cap runs inside the cap, to the bytes of
an uncapped run, and its peak does not grow with the checkpoint: memory is bounded by the largest
tensor (plus the interpreter and the writer's flush size), not by the model.

The cap is a cgroup v1 memory controller (``test_memory_cap.py`` says how); each conversion runs in
a fresh process that joins the cgroup before it execs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model_factory import make_streamed_llama_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))
from test_memory_cap import differing_tensors, memory_cgroup, oom_kills  # noqa: E402

# 512 MiB held the W8A16 conversion of 16 MiB tensors with room; 400 MiB was OOM-killed
# (benchmarks/RESULTS.md, "Model-free conversion")
CAP = 512 * 2**20
# hidden 1024, intermediate 4096, fp32: 64 MiB a layer, the largest tensor 16 MiB; 26 layers: 3.3x the cap
LAYERS, HIDDEN, VOCAB = 26, 1024, 4096

CHILD = r"""
import json, sys
from quantkit.workflows.model_free import quantize_model_free
src, out, recipe = sys.argv[1:4]
quantize_model_free(src, recipe).save(out)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"peak_rss": hwm * 1024}))
"""


def convert(src: Path, out: Path, group: Path | None = None) -> dict:
    join = None if group is None else (lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", CHILD, str(src), str(out), "w8a16"], capture_output=True, text=True,
                         preexec_fn=join, timeout=900, env=env)
    assert res.returncode == 0, f"conversion exited {res.returncode}:\n{res.stderr[-3000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("model-free-capped")
    return {n: make_streamed_llama_dir(root / f"layers-{n}", n, HIDDEN, vocab=VOCAB, shard_bytes=200e6)
            for n in (LAYERS // 2, LAYERS)}


def test_a_checkpoint_three_times_the_cap_converts_inside_it(models, tmp_path):
    src = models[LAYERS]
    size = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    assert size >= 3 * CAP, f"the checkpoint ({size / 2**20:.0f} MiB) must be at least 3x the cap"
    with memory_cgroup(CAP) as group:
        convert(src, tmp_path / "capped", group)
        kills = oom_kills(group)
    assert kills == 0, f"the capped conversion was OOM-killed {kills} times"
    deep = convert(src, tmp_path / "uncapped")
    assert differing_tensors(tmp_path / "capped", tmp_path / "uncapped") == []
    # half the checkpoint, the same tensors: the same peak (what is resident is one tensor's work)
    shallow = convert(models[LAYERS // 2], tmp_path / "shallow")
    print(f"\ncheckpoint {size / 2**20:.0f} MiB, cap {CAP / 2**20:.0f} MiB: peak RSS {deep['peak_rss'] / 2**20:.0f} "
          f"MiB ({LAYERS} layers), {shallow['peak_rss'] / 2**20:.0f} MiB ({LAYERS // 2} layers)")
    # the heap's noise is tens of MiB; holding the model would add the 848 MiB the deep one has more
    assert deep["peak_rss"] - shallow["peak_rss"] < size / 2 / 8
