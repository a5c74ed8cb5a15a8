"""What the engine tests share: the engine's Python (required: these tests fail, never skip,
without it), checkpoints of the embedded default, and the quantkit command run as a user runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = Path(os.environ.get("QUANTKIT_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")
# a recipe whose eval: section makes the suite small (quantkit eval reads only that section)
SMALL_RECIPE = {"scheme": "FP8_DYNAMIC", "eval": {"options": {"text_items": 6, "mc_items": 12, "gen_prompts": 4, "gen_tokens": 16}}}


def require_engine() -> Path:
    assert ENGINE_PYTHON.exists(), f"{ENGINE_PYTHON}: missing: build it with bash scripts/setup-engine.sh"
    return ENGINE_PYTHON


def quantkit(*args, env: dict | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quantkit.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)


def convert(recipe: str, out: Path) -> Path:
    return convert_with(recipe, out)


def convert_with(recipe: str, out: Path, *flags: str) -> Path:
    res = quantkit("convert", "--recipe", recipe, "--out", out, "--no-eval", *flags, timeout=1200)
    assert res.returncode == 0, res.stderr[-2000:]
    return out


def small_recipe(path: Path, **options) -> Path:
    import yaml

    recipe = {**SMALL_RECIPE, "eval": {"options": {**SMALL_RECIPE["eval"]["options"], **options}}}
    path.write_text(yaml.safe_dump(recipe))
    return path


def report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def engine_processes(marker: str) -> list[str]:
    """Command lines of live processes that mention ``marker`` (a checkpoint path unique to a test)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            out.append(f"{entry}: {cmd[:200]}")
    return out


def no_engine_left(marker: str, within_s: float = 30.0) -> list[str]:
    """The engine processes still alive after ``within_s`` (the watchdog polls every 0.2 s and
    gives each process 10 s after SIGTERM)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = engine_processes(marker)
        if not left:
            return []
        time.sleep(0.5)
    return engine_processes(marker)


def held_out_traffic(path: Path, rows: int = 48) -> Path:
    """A traffic log quantkit never calibrated on: prompt/completion rows cut from Python's own
    documentation (pydoc_data.topics), prompts of 20 to about 400 words, replies of 10 to 80."""
    from pydoc_data.topics import topics

    texts = [" ".join(t.split()) for _, t in sorted(topics.items()) if len(t.split()) > 500]
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            words = texts[i % len(texts)].split()
            n_prompt, n_reply = 20 + (i * 37) % 380, 10 + (i * 13) % 70
            f.write(json.dumps({"prompt": "Explain this passage: " + " ".join(words[:n_prompt]),
                                "completion": " ".join(words[n_prompt:n_prompt + n_reply])}) + "\n")
    return path
