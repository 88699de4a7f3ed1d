#!/usr/bin/env bash
# The checks that need a GPU (CUDA, NCCL), in one call on the machine lent for them:
#     bash benchmarks/gpu_wheels.sh                   here, once: the wheels that machine lacks
#     bash benchmarks/gpu_check.sh                    there, from the repository root, carrying .whl
# That machine (one H200, Python 3.12, torch 2.11.0+cu130, nothing reachable) keeps its own torch:
# commlab goes in with `pip install --no-deps -e .` and the carried wheels.  One GPU means one NCCL
# rank, so each check is what one rank can show: PyTorch's stock hooks through DDP on CUDA,
# commlab's communication thread, the CUDA-event timeline and torch.profiler's kernels, the
# bandwidth bench.  Without a GPU it says so and exits 0; with one, the first failed check fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA GPU here ($("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null \
    || echo 'no torch')): nothing to check"
  exit 0
fi

echo "== install (the machine's torch stays)"
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/commlab-site .whl/*.whl
  export PYTHONPATH=/tmp/commlab-site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e .
export COMMLAB_RUNS_DIR="${COMMLAB_RUNS_DIR:-$(mktemp -d)}"
"$PY" - <<'PYEOF'
import torch
import torch.distributed as dist

print("torch", torch.__version__, "CUDA", torch.version.cuda, "on", torch.cuda.device_count(), "x",
      torch.cuda.get_device_name(), "; NCCL", ".".join(map(str, torch.cuda.nccl.version())),
      "; NCCL available:", dist.is_nccl_available())
PYEOF

echo "== 1. the suite's NCCL tests: stock hooks through DDP on CUDA, a step traced on the device"
"$PY" -m pytest -p no:xdist -p no:cacheprovider -o addopts="" -q -m gpu tests/test_gpu.py tests/test_trace_cuda.py

echo "== 2. commlab's communication thread on NCCL, a traced run with torch.profiler"
"$PY" - <<'PYEOF'
import json

import torch

from commlab.api import RunConfig, run

n = torch.cuda.device_count()
# commlab's PowerSGD forced (impl=commlab), overlapping (its communication thread), with several
# buckets: same numbers as PyTorch's, its collectives issued from the thread on NCCL's stream.
r = run(RunConfig(workload="mlp", backend="nccl", world_size=n, steps=12, hook="powersgd",
                  impl="commlab", overlap=True, start_powerSGD_iter=2, bucket_cap_mb=0.05), timeout=300)
assert r.status() == "finished", r.status_record()
assert r.meta()["hook_impl"] == "commlab", r.meta()
print("commlab powersgd on nccl (communication thread):", r.metrics()["loss"].iloc[-1], r.path)

# Every event of timeline.json timed by CUDA events (clock "cuda"), inside the step's host times,
# and every rank's profiler trace holding CUDA kernels.
r = run(RunConfig(workload="mlp", backend="nccl", world_size=n, steps=3,
                  trace_steps=[1], torch_profiler=True, bucket_cap_mb=0.05), timeout=300)
assert r.status() == "finished", r.status_record()
for rank, events in r.timeline()["steps"]["1"].items():
    kinds = {e["kind"] for e in events}
    assert kinds >= {"backward", "optimizer", "hook", "future", "collective"}, (rank, kinds)
    assert all(e.get("clock") == "cuda" for e in events), (rank, events)
    first = min(e["host_start"] for e in events)  # the device runs after the host queues
    assert all(e["start"] >= first - 1e-3 and e["end"] >= e["start"] for e in events), (rank, events)
traces = r.profiler_traces()
assert len(traces) == n, traces
for path in traces:
    cats = {e.get("cat") for e in json.loads(path.read_text())["traceEvents"]}
    assert "kernel" in cats, (path, cats)
print("cuda timeline and profiler traces ok:", r.path)
PYEOF

echo "== 3. the bandwidth bench on NCCL (nccl-tests' columns; #wrong must be 0)"
n=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
"$PY" -m commlab bench --backend nccl --world-size "$n" --sizes 1MB,64MB,1GB \
  --collectives all_reduce,all_gather,broadcast --json | tail -n 1 | "$PY" -c "
import json, sys
rows = json.loads(sys.stdin.read())['rows']
for r in rows:
    o = r['out_of_place']
    print(f\"{r['collective']:<15} {r['size']:>6} {o['time_us']:>12.1f} us {o['algbw_gbytes_s']:>9.2f} GB/s algbw\")
wrong = [r for r in rows if r['out_of_place']['wrong'] or r['in_place']['wrong']]
assert rows and not wrong, wrong
print('bench: every collective exact on', len(rows), 'rows')"
echo "gpu_check: every check passed"
