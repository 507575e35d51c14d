#!/usr/bin/env bash
# The GPU check of engine/kernels, for a machine with an NVIDIA GPU (under 8 minutes on an H200):
#   0. the probe's choices on CUDA (dtype auto, Triton attention, cuBLAS linears), one generation;
#   1. the kernel tests on CUDA (bf16, fp16, fp32): Triton against torch, and the engine end to end
#      in float32 on CUDA, greedy tokens equal to HF transformers' recorded ones (every reference
#      prompt, also in 64-token chunks and with a prefix-cache hit);
#   2. bench/kernel_bench.py: paged_attention_decode with triton.testing.do_bench (median), batch
#      1-128 x context 512-8192, GB/s against a device-to-device copy it measures;
#   3. bench/engine_bench.py --device cuda: output tok/s on the engine bench workload.
#
#   bash bench/gpu_check.sh          (from anywhere; PY=/path/to/python to choose the interpreter)
#
# Python: $PY, else .venv/bin/python, else python3 if it has torch and triton, else `make`'s venv
# (the Makefile's install step, needs the package index). requirements.txt pins torch==2.13.0;
# whatever the interpreter, its torch must be a CUDA build: this script says so if it is not.
# Results go to stdout and, as JSON, to $OUT/kernel_bench.json ($OUT defaults to .cache).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT="${OUT:-.cache}"
mkdir -p "$OUT"

die() {
  echo "gpu_check: $*" >&2
  exit 1
}

has_torch_and_triton() { "$1" -c "import torch, triton" >/dev/null 2>&1; }

if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
  elif command -v python3 >/dev/null && has_torch_and_triton python3; then
    PY=python3
  else
    command -v nvidia-smi >/dev/null || [ -e /dev/nvidiactl ] ||
      die "no NVIDIA GPU on this machine (no nvidia-smi, no /dev/nvidiactl); run this on a CUDA machine"
    make ".venv/.installed-$(cksum <requirements.txt | cut -d' ' -f1)" # the Makefile's venv, as `make test`
    PY=.venv/bin/python
  fi
fi

# CUDA first, with a message that says what is missing, before any test or benchmark runs.
"$PY" - <<'EOF' || exit 1
import sys

try:
    import torch
except ImportError as err:
    sys.exit(f"gpu_check: {sys.executable} cannot import torch ({err}); install requirements.txt first")
if torch.version.cuda is None:
    sys.exit(
        f"gpu_check: torch {torch.__version__} in {sys.executable} is a CPU-only build; this check needs a CUDA "
        "build of torch (requirements.txt pins the version, the GPU machine must provide its CUDA wheel)"
    )
if not torch.cuda.is_available():
    sys.exit(
        f"gpu_check: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device: "
        "run this on a machine with an NVIDIA GPU and its driver"
    )
try:
    import triton
except ImportError as err:
    sys.exit(f"gpu_check: cannot import triton ({err}); install requirements.txt first")
print(f"gpu_check: {torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {triton.__version__}, {sys.executable}")
EOF

phase() { echo; echo "=== $1 ($(date +%T))"; }

phase "what the probe decides on this GPU (engine/machine.py): dtype auto, kernels, one generation"
"$PY" - <<'EOF'
import json
from engine import LLM, SamplingParams, machine
print("auto dtype on cuda:", machine.auto_dtype("cuda"), "| gpu:", machine.describe_cuda())
llm = LLM(device="cuda")  # dtype auto: bf16 on sm_80 and later, fp16 before
plan = llm.engine.plan
print(json.dumps(plan.to_json()))
assert plan.dtype == machine.auto_dtype("cuda")[0] and plan.attention == "triton" and plan.linear == "cublas", plan
out = llm.generate(["The three primary colors are"], SamplingParams(temperature=0, max_tokens=16))
print("greedy:", repr(out[0].text))
EOF

phase "kernel tests on CUDA (bf16, fp16, fp32) and the engine on CUDA against HF's greedy tokens"
SERVELAB_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider --durations=5 \
  tests/test_triton_attention.py tests/test_attention_math.py

phase "decode kernel bandwidth (bench/kernel_bench.py)"
"$PY" -m bench.kernel_bench --json "$OUT/kernel_bench.json"

phase "engine bench workload on CUDA (bench/engine_bench.py --device cuda)"
"$PY" -m bench.engine_bench --device cuda --skip-peers

phase "done"
