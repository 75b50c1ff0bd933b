#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU, torch with CUDA preinstalled
# (2.11+) and no network access (nothing is installed from PyPI):
#   OUT=/some/dir bash benchmarks/gpu_check.sh     # from anywhere
# Sized for a lent H200 (about 15 minutes of device time in all, 10 per
# command, machine start and copying included): every step has its own
# time cap, and the caps sum to under 8 minutes (GPU_CHECK_BUDGET_S, 470 s).
#  1. preflight: the GPU's compute mode and MIG state, the Python prerequisites;
#  2. builds fairring_py._C in place with its CUDA parts, for sm_90 only
#     (TORCH_CUDA_ARCH_LIST=9.0, override it for another GPU), ninja in
#     parallel; skipped when the in-place extension already imports with its
#     CUDA parts and was built against this torch (one built elsewhere for the
#     device's Python and torch, carried along: docs/GPU.md);
#  3. a smoke run (1x2 and 2x1, small and large, group timeout 20 s) that
#     stops the script if it fails: if that does not work, nothing after it
#     can say more;
#  4. the kernel tests; correctness, stream semantics, collectives and issue
#     order on 1x2, 2x1, 2x2; the desk-review checks (256 KiB slices, 3x1,
#     polling, slow producers, group cycles); the watchdog (stalled device
#     work, a local peer killed with work queued); compressed rails; timings;
#     last the kernel tests under compute-sanitizer memcheck (without the
#     caching allocator) if it exists.
# A test's own limit (40 s per rank session, group timeout 20 s) is below its
# step's cap; a step that runs out of time has pytest and every rank dump their
# Python stacks (faulthandler) 10 s before its cap.  Everything goes under
# $OUT (default bench_out/): build log, one log per step, every rank's log
# under $OUT/ranks/<step>/, gpu_bench.json; a failing step prints its failing
# lines, not a bare FAILED.
set -uo pipefail

cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-bench_out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUDGET_S="${GPU_CHECK_BUDGET_S:-470}"  # the caps below sum to this; the hard limit is 8 min
start=$(date +%s)
fail=0
elapsed() { echo $(( $(date +%s) - start )); }
step() { echo; echo "== [$(elapsed)s] $*"; }
# A step's limit: `want` seconds, less if the budget is nearly spent.
limit() {
  local want=$1 left=$(( BUDGET_S - $(elapsed) ))
  [ "$left" -lt "$want" ] && want=$left
  echo "$want"
}

step "preflight"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,compute_mode,mig.mode.current,memory.total,driver_version \
    --format=csv,noheader | tee "$OUT/gpus.txt"
  if grep -qi "exclusive" "$OUT/gpus.txt"; then
    echo "cannot run the GPU check: a GPU is in EXCLUSIVE_PROCESS compute mode, so only one process can use it;"
    echo "the tests run several ranks (processes) on one GPU. Set it to DEFAULT (nvidia-smi -c DEFAULT) or use another machine."
    exit 2
  fi
  if grep -qi ", enabled," "$OUT/gpus.txt"; then
    echo "note: MIG is enabled; CUDA IPC between the ranks needs them on the same MIG instance (one GPU visible)"
  fi
else
  echo "note: no nvidia-smi; compute mode and MIG state not checked"
fi
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

# A prebuilt in-place extension is used if it imports, has its CUDA parts and
# was built against this very torch; otherwise build.
if "$PY" -c "import torch; from fairring_py import _C; b = _C._build_info(); \
assert _C._built_with_cuda() and b['torch_built_against'] == torch.__version__.split('+')[0], b" 2>/dev/null; then
  step "build SKIPPED: the in-place extension is a CUDA build against this torch"
else
  step "build (FAIRRING_BUILD_CUDA=1, TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}, in place)"
  if ! FAIRRING_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
       timeout "$(limit 150)" "$PY" setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1; then
    grep -n -A8 "error" "$OUT/build.log" | head -n 60 || tail -n 40 "$OUT/build.log"
    echo "== build FAILED or ran out of time (log: $OUT/build.log)"
    exit 1
  fi
fi
"$PY" -c "from fairring_py import _C; assert _C._built_with_cuda(), 'built without CUDA'; print('built', _C.__file__, _C._build_info())" || exit 1

# One bounded test session: its output in $OUT/<name>.log, the ranks' logs
# under $OUT/ranks/<name>/.  Stacks are dumped 10 s before the limit.
session() {
  local name=$1 want=$2; shift 2
  local lim; lim=$(limit "$want")
  step "session $name (limit ${lim}s)"
  if [ "$lim" -lt 20 ]; then
    echo "== $name SKIPPED: the time budget is spent"; fail=1; return
  fi
  FAIRRING_TEST_LOG_DIR="$OUT/ranks/$name" FAIRRING_TEST_DUMP_AFTER=$(( lim - 10 )) \
    timeout -k 5 "$lim" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 15 "$OUT/$name.log"
  if [ "$rc" != 0 ]; then
    # The lines that say what failed, not a bare FAILED.
    echo "-- $name: failing lines"
    grep -E "^(E |FAILED|ERROR)|Error:|rank [0-9]+: " "$OUT/$name.log" | grep -v "^E *$" | head -n 40
  fi
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "== $name TIMED OUT after ${lim}s (stacks in $OUT/$name.log and $OUT/ranks/$name/)"; fail=1
  elif [ "$rc" != 0 ]; then
    echo "== $name FAILED (rc $rc; log $OUT/$name.log)"; fail=1
  fi
}

PYTEST=("$PY" -m pytest -q -p no:cacheprovider)
session smoke 40 "${PYTEST[@]}" -x tests/test_gpu_allreduce.py -k "smoke"
if [ "$fail" != 0 ]; then
  step "done: FAILED at the smoke run (results under $OUT)"
  exit 1
fi
session kernels 35 "${PYTEST[@]}" tests/test_gpu_kernels.py tests/test_gpu_options.py
session allreduce 90 "${PYTEST[@]}" tests/test_gpu_allreduce.py \
  -k "not smoke and not slice256K and not 3x1 and not shared_gpu and not nccl and not compressed and not budget and not watchdog and not killed_with"
session review 40 "${PYTEST[@]}" tests/test_gpu_allreduce.py \
  -k "(slice256K or 3x1 or shared_gpu or nccl) and not compressed"
# Stalled device work (3 x a 3 s group timeout) and a peer killed with work queued.
session watchdog 45 "${PYTEST[@]}" tests/test_gpu_allreduce.py -k "watchdog or killed_with"
# Compressed rails (FAIRRING_WIRE_DTYPE) on both transports, and their memory budget.
session wire 40 "${PYTEST[@]}" tests/test_gpu_allreduce.py -k "compressed or budget"
# The staged TCP rail through dedicated reduction servers (3 nodes, 2 servers).
session servers 40 "${PYTEST[@]}" tests/test_reduction_servers.py -k "cuda"
session timings 25 "$PY" benchmarks/gpu_bench.py --quick --json "$OUT/gpu_bench.json"
# Last: memcheck slows every kernel and copy down a lot (a few cases only),
# and without the caching allocator it sees each buffer's real bounds.
SANITIZER="$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" 2>/dev/null || true)"
if [ -n "$SANITIZER" ]; then
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 session memcheck 25 "$SANITIZER" --tool memcheck --error-exitcode 9 \
    --print-limit 20 "${PYTEST[@]}" tests/test_gpu_kernels.py \
    -k "float32-SUM or bfloat16-AVG or int8-MAX or unaligned or wire_message or nan_bits"
else
  step "memcheck SKIPPED: no compute-sanitizer (in PATH or \$CUDA_HOME/bin)"
fi

step "done: $([ "$fail" = 0 ] && echo OK || echo FAILED) (results under $OUT)"
exit "$fail"
