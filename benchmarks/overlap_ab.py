"""The overlapping and the blocking variant of one hook, and the overlapping one without the
emulated link, step by step in one DDP run: the A/B half of ``benchmarks/overlap.py``.

    python -m commlab.engine.torchrun --nproc-per-node 2 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:0 --local-addr 127.0.0.1 benchmarks/overlap_ab.py CONFIG.json OUT.json

CONFIG.json holds a RunConfig (the lab's settings table).  The model, data, hook
(``registry.choose``), emulated link (``CollectiveCounter`` with ``Link``), optimizer and the
mean-loss allreduce are the lab worker's; its bookkeeping (metrics rows, traces, the pitfall
watch: the same for every side, under a millisecond a step) is left out.  The side changes step
by step, there and back (``SIDES`` in the order ABCCBA), so that a load that drifts, which on a
shared machine moves whole runs by ±10%, weighs on each alike; the variants give the same numbers
bit for bit (``tests/test_overlap.py``) and the link only holds completions back, so the
training does not depend on the schedule.  The unlinked side is the floor of any overlapping
variant at that link: it is the step with all of the link's time hidden.  Rank 0 writes, per
step, the time it ended (seconds from the start) and its side.
"""
import json
import sys
import time
from pathlib import Path

import torch.distributed as dist
from bare_ddp import ddp_on_gloo  # benchmarks/
from ratios import side

from commlab.config import RunConfig
from commlab.engine.teardown import end_process_group
from commlab.engine.worker import make_optimizer
from commlab.hooks import comm_thread, registry
from commlab.hooks.instrument import OTHER, CollectiveCounter, Link

SIDES = ("overlapping", "blocking", "unlinked")  # unlinked: overlapping, without the emulated link


def main() -> None:
    cfg = RunConfig.from_dict(json.loads(Path(sys.argv[1]).read_text()))
    rank, work, ddp = ddp_on_gloo(cfg.workload, cfg.batch_size, cfg.seed, cfg.bucket_cap_mb)
    world = dist.get_world_size()
    choice = registry.choose(cfg.with_overrides(overlap=True), "gloo")
    # The blocking variant's function (overlap off), registered on the first choice's state.
    blocking = registry.choose(cfg.with_overrides(overlap=False), "gloo").hook
    link = Link(cfg.emulate_bandwidth_gbps, cfg.emulate_latency_us)
    counter = CollectiveCounter(link, world).install()
    current = [choice.hook]

    def hook(state, bucket):  # no annotations: DDP compares them with real types
        return current[0](state, bucket)

    ddp.register_comm_hook(choice.state, hook)
    optimizer = make_optimizer(cfg, ddp.parameters())
    batches = work.batches()
    schedule = [SIDES[side(step, len(SIDES))] for step in range(cfg.steps)]
    ends, t_start = [], time.perf_counter()
    for step in range(cfg.steps):
        # Between steps nothing is in flight: DDP waited for every future in backward.
        current[0] = blocking if schedule[step] == "blocking" else choice.hook
        counter.link = Link() if schedule[step] == "unlinked" else link
        loss = work.loss_of(ddp, next(batches))
        mean_loss = loss.detach().clone()
        with counter.category(OTHER):
            loss_work = dist.all_reduce(mean_loss, async_op=True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_work.wait()
        mean_loss.item()
        ends.append(time.perf_counter() - t_start)
    if rank == 0:
        Path(sys.argv[2]).write_text(json.dumps({"ends": ends, "sides": schedule}))
    comm_thread.close()
    counter.uninstall()
    del ddp
    end_process_group()


if __name__ == "__main__":
    main()
