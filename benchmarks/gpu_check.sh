#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU, torch with CUDA preinstalled
# (2.11+) and no network access (nothing is installed from PyPI):
#   bash benchmarks/gpu_check.sh            # from the repository root or anywhere
# 1. builds fairring_py._C in place with its CUDA parts (for this GPU's architecture),
# 2. runs the GPU tests (kernels vs CPU kernel / float64 reference; 1x2, 2x1, 2x2
#    simulated clusters on the available GPU(s); DDP on GPU vs gloo),
# 3. times the reduction kernels (as a fraction of device-to-device copy bandwidth
#    measured in the same run) and the all-reduce (vs NCCL where each rank has a GPU).
# Each step has a time limit; the whole script stays under 8 minutes.
# Figures also go to $OUT_DIR/gpu_bench.json (default bench_out/).
set -uo pipefail

cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT_DIR="${OUT_DIR:-bench_out}"
mkdir -p "$OUT_DIR"
start=$(date +%s)
fail=0
step() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }

step "prerequisites"
"$PY" - <<'PYEOF' || exit 2
import importlib, shutil, sys
import torch
from torch.utils import cpp_extension
problems = []
if torch.version.cuda is None:
    problems.append(f"torch {torch.__version__} has no CUDA")
elif not torch.cuda.is_available():
    problems.append("torch sees no CUDA device")
if cpp_extension.CUDA_HOME is None:
    problems.append("no CUDA toolkit (nvcc) found: set CUDA_HOME")
for mod, why in (("pytest", "runs the GPU tests"), ("numpy", "the tests digest results with it")):
    if importlib.util.find_spec(mod) is None:
        problems.append(f"python module {mod} missing ({why})")
if importlib.util.find_spec("ninja") is None and shutil.which("ninja") is None:
    print("note: ninja not found; the build runs one compiler at a time (slower)")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), CUDA_HOME={cpp_extension.CUDA_HOME}, "
      f"{torch.cuda.device_count() if torch.version.cuda else 0} GPU(s): "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else '-'}")
if problems:
    print("cannot run the GPU check: " + "; ".join(problems))
    sys.exit(1)
PYEOF

step "build (FAIRRING_BUILD_CUDA=1, in place)"
if ! FAIRRING_BUILD_CUDA=1 MAX_JOBS="${MAX_JOBS:-16}" timeout 300 "$PY" setup.py -q build_ext --inplace \
     >"$OUT_DIR/gpu_build.log" 2>&1; then
  grep -n -A8 "error" "$OUT_DIR/gpu_build.log" | head -n 60 || tail -n 40 "$OUT_DIR/gpu_build.log"
  echo "== build FAILED (log: $OUT_DIR/gpu_build.log)"
  exit 1
fi
"$PY" -c "from fairring_py import _C; assert _C._built_with_cuda(), 'built without CUDA'; print('built', _C.__file__)" || exit 1

step "GPU tests"
if ! timeout 240 "$PY" -m pytest -q -x tests/test_gpu_kernels.py tests/test_gpu_allreduce.py tests/test_gpu_options.py \
     2>&1 | tee "$OUT_DIR/gpu_tests.log"; then
  echo "== GPU tests FAILED"
  fail=1
fi

step "timings"
if ! timeout 150 "$PY" benchmarks/gpu_bench.py --json "$OUT_DIR/gpu_bench.json" 2>&1 | tee "$OUT_DIR/gpu_bench.log"; then
  echo "== timings FAILED (or ran out of time)"
  fail=1
fi

step "done: $([ "$fail" = 0 ] && echo OK || echo FAILED)"
exit "$fail"
