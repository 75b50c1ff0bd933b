#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU, torch with CUDA preinstalled
# (2.11+) and no network access (nothing is installed from PyPI):
#   OUT=/some/dir bash benchmarks/gpu_check.sh     # from anywhere
# Sized for a lent H200: 15 minutes of device time per session (machine
# start, copying, every command and idle time included) and 10 minutes per
# command.  Every step has its own time cap, and the caps sum to the
# budget, GPU_CHECK_BUDGET_S = 450 s (7.5 min: one command, with the
# machine's start of 1-3 min and the copy under the 15).  What the caps are
# set from (measured, docs/GPU.md "Checks"): the smoke run's cases, the
# float64 references, Python/torch start-up per rank.
#  1. preflight: the GPU's compute mode and MIG state, the Python
#     prerequisites, and a CUDA IPC probe (one process maps another's
#     memory): where IPC does not work (some sandboxed machines) that is
#     reported as an environment limit and only what needs none runs;
#  2. builds fairring_py._C in place with its CUDA parts, for sm_90 only
#     (TORCH_CUDA_ARCH_LIST=9.0, override it for another GPU), ninja in
#     parallel; skipped when the in-place extension already imports with its
#     CUDA parts and was built against this torch (one built elsewhere for the
#     device's Python and torch, carried along: docs/GPU.md);
#  3. a smoke run (1x1, 1x2, 2x1: every dtype and op small, three large,
#     group timeout 20 s); the script stops there only if none of them
#     passed (1x2 needs CUDA IPC, the other two do not);
#  4. the kernel tests; correctness, stream semantics, collectives and issue
#     order on 1x1, 1x2, 2x1, 2x2; the desk-review checks (256 KiB slices, 3x1,
#     polling, slow producers, group cycles); the watchdog (stalled device
#     work, a local peer killed with work queued); compressed rails; timings
#     (never fatal); last the kernel tests under compute-sanitizer memcheck
#     (without the caching allocator) if it exists (a sanitizer that refuses
#     the device is a skip).
# A test's own limit (40 s per rank session, group timeout 20 s) is below its
# step's cap; a step that runs out of time has pytest and every rank dump their
# Python stacks (faulthandler) 10 s before its cap.  Everything goes under
# $OUT (default bench_out/): build log, one log per step, every rank's log
# under $OUT/ranks/<step>/, gpu_bench.json; a failing step prints its failing
# lines, not a bare FAILED.  GPU_CHECK_DRY_RUN=1 prints the steps and caps
# without running anything.
set -uo pipefail

cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-bench_out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BUDGET_S="${GPU_CHECK_BUDGET_S:-450}"  # the caps below sum to this (CAPS_S)
DRY="${GPU_CHECK_DRY_RUN:-0}"
# Each step's cap, seconds.
CAP_PREFLIGHT=20; CAP_BUILD=140; CAP_SMOKE=30; CAP_KERNELS=25; CAP_ALLREDUCE=75; CAP_REVIEW=30
CAP_WATCHDOG=35; CAP_WIRE=30; CAP_SERVERS=25; CAP_TIMINGS=20; CAP_MEMCHECK=20
CAPS_S=$(( CAP_PREFLIGHT + CAP_BUILD + CAP_SMOKE + CAP_KERNELS + CAP_ALLREDUCE + CAP_REVIEW + CAP_WATCHDOG \
  + CAP_WIRE + CAP_SERVERS + CAP_TIMINGS + CAP_MEMCHECK ))
if [ "$CAPS_S" -gt "$BUDGET_S" ]; then
  echo "gpu_check.sh: its step caps sum to ${CAPS_S}s, over the ${BUDGET_S}s budget (GPU_CHECK_BUDGET_S)"; exit 2
fi
start=$(date +%s)
fail=0        # a Fairring failure
incomplete=0  # a step not run: the budget was spent, or the environment lacks something
no_ipc=0
elapsed() { echo $(( $(date +%s) - start )); }
step() { echo; echo "== [$(elapsed)s] $*"; }
# A step's limit: `want` seconds, less if the budget is nearly spent.
limit() {
  local want=$1 left=$(( BUDGET_S - $(elapsed) ))
  [ "$left" -lt "$want" ] && want=$left
  echo "$want"
}
if [ "$DRY" = 1 ]; then
  echo "dry run: caps preflight ${CAP_PREFLIGHT}s, build ${CAP_BUILD}s, smoke ${CAP_SMOKE}s, kernels ${CAP_KERNELS}s,"
  echo "  allreduce ${CAP_ALLREDUCE}s, review ${CAP_REVIEW}s, watchdog ${CAP_WATCHDOG}s, wire ${CAP_WIRE}s,"
  echo "  servers ${CAP_SERVERS}s, timings ${CAP_TIMINGS}s, memcheck ${CAP_MEMCHECK}s"
  echo "  sum ${CAPS_S}s of a ${BUDGET_S}s budget (a device command may run 600 s; a session has 900 s of device time)"
  exit 0
fi

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
timeout "$CAP_PREFLIGHT" "$PY" - <<'PYEOF' || exit 2
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
# CUDA IPC: a second process maps this one's device memory and writes it,
# as a node's ranks do.  Some sandboxed machines forbid it: an environment
# limit, not a Fairring failure.
cat >"$OUT/ipc_probe.py" <<'PYEOF'
import torch, torch.multiprocessing as mp
def child(t, q):
    try:
        t.add_(1); torch.cuda.synchronize(); q.put("ok")
    except Exception as e:  # noqa: BLE001
        q.put(f"{type(e).__name__}: {e}")
if __name__ == "__main__":
    ctx = mp.get_context("spawn"); q = ctx.Queue(); t = torch.zeros(4, device="cuda")
    p = ctx.Process(target=child, args=(t, q)); p.start(); r = q.get(timeout=15); p.join(15)
    raise SystemExit(0 if r == "ok" and t.sum().item() == 4 else f"CUDA IPC probe: {r}")
PYEOF
if ! timeout "$CAP_PREFLIGHT" "$PY" "$OUT/ipc_probe.py" >"$OUT/ipc_probe.log" 2>&1; then
  no_ipc=1; incomplete=1
  echo "ENVIRONMENT LIMIT: CUDA IPC between processes does not work on this machine ($(tail -n 1 "$OUT/ipc_probe.log"));"
  echo "  only the checks without node peers run (1x1, 2x1, 3x1, kernels); this is not a Fairring failure"
fi

# A prebuilt in-place extension is used if it imports, has its CUDA parts and
# was built against this very torch; otherwise build.
if "$PY" -c "import torch; from fairring_py import _C; b = _C._build_info(); \
assert _C._built_with_cuda() and b['torch_built_against'] == torch.__version__.split('+')[0], b" 2>/dev/null; then
  step "build SKIPPED: the in-place extension is a CUDA build against this torch"
else
  step "build (FAIRRING_BUILD_CUDA=1, TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}, in place)"
  if ! FAIRRING_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
       timeout "$(limit "$CAP_BUILD")" "$PY" setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1; then
    grep -n -A8 "error" "$OUT/build.log" | head -n 60 || tail -n 40 "$OUT/build.log"
    echo "== build FAILED or ran out of time (log: $OUT/build.log)"
    exit 1
  fi
fi
"$PY" -c "from fairring_py import _C; assert _C._built_with_cuda(), 'built without CUDA'; print('built', _C.__file__, _C._build_info())" || exit 1

# One bounded test session: its output in $OUT/<name>.log, the ranks' logs
# under $OUT/ranks/<name>/.  Stacks are dumped 10 s before the limit.  Sets
# RC (the command's exit status; "" if not run) and says what happened;
# judging it is the caller's (judge).
session() {
  local name=$1 want=$2; shift 2
  local lim; lim=$(limit "$want")
  RC=""
  step "session $name (limit ${lim}s)"
  if [ "$lim" -lt 20 ]; then
    echo "== $name NOT RUN: the time budget is spent"; incomplete=1; return
  fi
  FAIRRING_TEST_LOG_DIR="$OUT/ranks/$name" FAIRRING_TEST_DUMP_AFTER=$(( lim - 10 )) \
    timeout -k 5 "$lim" "$@" >"$OUT/$name.log" 2>&1
  RC=$?
  tail -n 15 "$OUT/$name.log"
  if [ "$RC" != 0 ]; then
    # The lines that say what failed, not a bare FAILED.
    echo "-- $name: failing lines"
    grep -E "^(E |FAILED|ERROR)|Error:|rank [0-9]+: " "$OUT/$name.log" | grep -v "^E *$" | head -n 40
  fi
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
    echo "== $name TIMED OUT after ${lim}s (stacks in $OUT/$name.log and $OUT/ranks/$name/)"
  elif [ "$RC" != 0 ]; then
    echo "== $name FAILED (rc $RC; log $OUT/$name.log)"
  fi
}
# A session whose failure is Fairring's.
judge() { if [ -n "$RC" ] && [ "$RC" != 0 ]; then fail=1; fi; }

PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rA)
# Without CUDA IPC only the topologies without node peers can run.
NO_PEERS="1x1 or 2x1 or 3x1"
only_runnable() { if [ "$no_ipc" = 1 ]; then echo "($1) and ($NO_PEERS)"; else echo "$1"; fi; }
session smoke "$CAP_SMOKE" "${PYTEST[@]}" tests/test_gpu_allreduce.py -k "$(only_runnable smoke)"
judge
# 1x2 needs CUDA IPC, 2x1 and 1x1 do not: the rest is worth running unless
# none of them passed.
if ! grep -qE "^PASSED .*\[smoke-" "$OUT/smoke.log" 2>/dev/null; then
  step "done: FAILED at the smoke run, no smoke case passed (results under $OUT)"
  exit 1
fi
session kernels "$CAP_KERNELS" "${PYTEST[@]}" tests/test_gpu_kernels.py tests/test_gpu_options.py
judge
ALLREDUCE="not smoke and not slice256K and not 3x1 and not shared_gpu and not nccl and not compressed and not budget and not watchdog and not killed_with"
REVIEW="(slice256K or 3x1 or shared_gpu or nccl) and not compressed"
session allreduce "$CAP_ALLREDUCE" "${PYTEST[@]}" tests/test_gpu_allreduce.py -k "$(only_runnable "$ALLREDUCE")"
judge
session review "$CAP_REVIEW" "${PYTEST[@]}" tests/test_gpu_allreduce.py -k "$(only_runnable "$REVIEW")"
judge
if [ "$no_ipc" = 1 ]; then
  step "watchdog, wire, servers NOT RUN: they need CUDA IPC (node peers)"
else
  # Stalled device work (3 x a 3 s group timeout) and a peer killed with work queued.
  session watchdog "$CAP_WATCHDOG" "${PYTEST[@]}" tests/test_gpu_allreduce.py -k "watchdog or killed_with"
  judge
  # Compressed rails (FAIRRING_WIRE_DTYPE) on both transports, and their memory budget.
  session wire "$CAP_WIRE" "${PYTEST[@]}" tests/test_gpu_allreduce.py -k "compressed or budget"
  judge
  # The staged TCP rail through dedicated reduction servers (3 nodes, 2 servers).
  session servers "$CAP_SERVERS" "${PYTEST[@]}" tests/test_reduction_servers.py -k "cuda"
  judge
fi
# Timings are findings, never a failure.
session timings "$CAP_TIMINGS" "$PY" benchmarks/gpu_bench.py --quick --json "$OUT/gpu_bench.json"
[ -n "$RC" ] && [ "$RC" != 0 ] && echo "== timings: not fatal"
# Last: memcheck slows every kernel and copy down a lot (a few cases only),
# and without the caching allocator it sees each buffer's real bounds.
SANITIZER="$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" 2>/dev/null || true)"
if [ -n "$SANITIZER" ]; then
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 session memcheck "$CAP_MEMCHECK" "$SANITIZER" --tool memcheck --error-exitcode 9 \
    --print-limit 20 "${PYTEST[@]}" tests/test_gpu_kernels.py \
    -k "float32-SUM or bfloat16-AVG or int8-MAX or unaligned or wire_message or nan_bits"
  # Exit status 9 is a memory error it found; a sanitizer that cannot
  # attach to the process or does not support the device says so in its
  # own "=========" lines before any test ran: a skip.
  if [ -n "$RC" ] && [ "$RC" != 0 ] && [ "$RC" != 9 ] \
     && grep -qiE "^========= .*(not supported|unable to|cannot|failed to|permission|no attachable|before first instrumented)" "$OUT/memcheck.log"; then
    echo "== memcheck SKIPPED: compute-sanitizer refused this device or process (an environment limit)"
    incomplete=1
  else
    judge
  fi
else
  step "memcheck SKIPPED: no compute-sanitizer (in PATH or \$CUDA_HOME/bin)"
fi

if [ "$fail" != 0 ]; then
  step "done: FAILED (results under $OUT)"
elif [ "$incomplete" != 0 ]; then
  step "done: OK as far as it ran, INCOMPLETE (an environment limit or the time budget; results under $OUT)"
else
  step "done: OK (results under $OUT)"
fi
exit "$fail"
