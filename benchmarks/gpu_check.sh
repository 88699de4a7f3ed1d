#!/usr/bin/env bash
# The checks that need a GPU, run once on a machine lent with one (CUDA, NCCL), from the repository
# root, in an environment where `pip install -e .` was run against a CUDA build of torch:
#     bash benchmarks/gpu_check.sh
# The CPU machines never run these paths; each line names what it verifies.  Fails on the first
# check that fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export COMMLAB_RUNS_DIR="${COMMLAB_RUNS_DIR:-$(mktemp -d)}"

python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU seen'; \
print('torch', torch.__version__, 'on', torch.cuda.device_count(), 'x', torch.cuda.get_device_name())"

# The NCCL paths of the suite: the hooks on NCCL, and a traced step timed on the device.
python -m pytest -p no:xdist -o addopts="" -q -m gpu tests/test_gpu.py tests/test_trace_cuda.py

# A short NCCL traced run, with torch.profiler on: every event of its timeline.json is timed by
# CUDA events (clock "cuda", commlab.hooks.instrument.DeviceClock), inside the step's host times,
# and every rank wrote a profiler trace holding CUDA kernels.
python - <<'EOF'
import json

import torch

from commlab.api import RunConfig, run

r = run(RunConfig(workload="mlp", backend="nccl", world_size=torch.cuda.device_count(), steps=3,
                  trace_steps=[1], torch_profiler=True, bucket_cap_mb=0.05), timeout=300)
assert r.status() == "finished", r.status_record()
for rank, events in r.timeline()["steps"]["1"].items():
    kinds = {e["kind"] for e in events}
    assert kinds >= {"backward", "optimizer", "hook", "future", "collective"}, (rank, kinds)
    assert all(e.get("clock") == "cuda" for e in events), (rank, events)
    # The device runs after the host queues: no device time before the step's first host time.
    first = min(e["host_start"] for e in events)
    assert all(e["start"] >= first - 1e-3 and e["end"] >= e["start"] for e in events), (rank, events)
traces = r.profiler_traces()
assert len(traces) == torch.cuda.device_count(), traces
for path in traces:
    cats = {e.get("cat") for e in json.loads(path.read_text())["traceEvents"]}
    assert "kernel" in cats, (path, cats)
print("cuda timeline and profiler traces ok:", r.path)
EOF
