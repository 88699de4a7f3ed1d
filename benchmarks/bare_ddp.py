"""A bare DDP training script, the yardstick for commlab's overhead (nanoGPT's loop, no lab).

    python -m commlab.engine.torchrun --nproc-per-node 2 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:0 --local-addr 127.0.0.1 benchmarks/bare_ddp.py --workload charlm --steps 100 --out t.json

Same model, data, optimizer, seed and hook as ``commlab run``; PyTorch's own allreduce_hook.
Rank 0 writes, per step, the time at which it ended (seconds from the start) to --out, and
whether the step did what commlab's worker adds (``--lab-steps alternate``).
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
from ratios import side  # benchmarks/
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from commlab import workloads
from commlab.engine.teardown import end_process_group
from commlab.seeds import stream_seed


def ddp_on_gloo(workload: str, batch_size: int, seed: int, bucket_cap_mb: float):
    """(rank, workload, DDP model) in a new Gloo process group, seeded as ``commlab run`` seeds
    its workers: the same initial weights on every rank, each rank its own randomness after."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    work = workloads.load(workload, rank, world, batch_size, seed)
    torch.manual_seed(stream_seed(seed, rank))
    return rank, work, DDP(work.model, bucket_cap_mb=bucket_cap_mb)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="charlm")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--out", required=True)
    p.add_argument("--lab-steps", choices=("never", "alternate"), default="never", help=(
        "alternate: at steps 0 and 3 mod 4 (ABBA) also do what commlab's worker adds to a step "
        "with its instrumentation off: the mean-loss allreduce, issued before backward and "
        "awaited after the optimizer step, and rank 0's metrics line"))
    a = p.parse_args()
    rank, work, model = ddp_on_gloo(a.workload, a.batch_size, a.seed, a.bucket_cap_mb)
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    batches = work.batches()
    ends, lab_steps = [], []
    metrics = (open(a.out + ".metrics.jsonl", "ab", buffering=0)
               if rank == 0 and a.lab_steps != "never" else None)
    t_start = time.perf_counter()
    for step in range(a.steps):
        lab = a.lab_steps == "alternate" and side(step) == 0
        loss = work.loss_of(model, next(batches))
        if lab:
            mean_loss = loss.detach().clone()
            loss_work = dist.all_reduce(mean_loss, async_op=True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()
        if lab:
            loss_work.wait()
            value = mean_loss.item() / dist.get_world_size()
            if metrics:
                metrics.write((json.dumps({"step": step, "loss": value,
                                           "t": time.perf_counter() - t_start}) + "\n").encode())
        ends.append(time.perf_counter() - t_start)
        lab_steps.append(lab)
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump({"ends": ends, "lab_steps": lab_steps}, f)
    del model
    end_process_group()


if __name__ == "__main__":
    main()
