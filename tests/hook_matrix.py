"""Every hook x wrapper that commlab offers, trained for a few steps on Gloo with several buckets.

    python -m commlab.engine.torchrun --nproc-per-node 3 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:0 --local-addr 127.0.0.1 tests/hook_matrix.py OUT.json

(tests/test_engine.py builds that line with the engine's ``commands.torchrun_argv``, as runs do.)

One torchrun job covers every combination (start-up costs seconds here).  Rank 0 writes, per
combination: the implementation used, the number of buckets after DDP's rebuild, the bytes
handed to collectives, and whether every rank ended with the same weights.
"""
import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from commlab.config import RunConfig
from commlab.engine.teardown import end_process_group
from commlab.hook_specs import PAGE, WRAPPERS, hooks_of
from commlab.hooks import comm_thread, registry
from commlab.hooks.instrument import CollectiveCounter

STEPS = 5  # compression starts at step 2, so three compressed steps


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


def train(cfg: RunConfig, counter: CollectiveCounter) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DDP(model(), bucket_cap_mb=cfg.bucket_cap_mb)
    choice = registry.choose(cfg, "gloo")
    ddp.register_comm_hook(choice.state, choice.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    counter.reset()
    for _ in range(STEPS):
        x = torch.randn(16, 64, generator=g)
        loss = torch.nn.functional.cross_entropy(ddp(x), torch.randint(10, (16,), generator=g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    sent = counter.take()[0]["hook"]  # before the replica check's own all_gather, which it counts
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    logging = ddp._get_ddp_logging_data()
    return {"hook": cfg.hook, "wrapper": cfg.wrapper, "impl": choice.impl, "name": choice.name,
            "buckets": len(str(logging.get("rebuilt_bucket_sizes", "")).split(",")),
            "bytes": sent,
            "replicas_equal": all(torch.equal(gathered[0], t) for t in gathered[1:]),
            "finite": bool(torch.isfinite(flat).all())}


def main(out: str) -> None:
    dist.init_process_group("gloo")
    counter = CollectiveCounter(world_size=dist.get_world_size()).install()
    results = []
    for hook in hooks_of(PAGE):  # the hooks of PyTorch's page; tests/test_compressors.py runs the others
        for wrapper in WRAPPERS:
            cfg = RunConfig(hook=hook, wrapper=wrapper, bucket_cap_mb=0.02, start_powerSGD_iter=2,
                            matrix_approximation_rank=2)
            if cfg.errors(gpu_count=0):
                continue  # wrappers around noop are refused by design
            results.append(train(cfg, counter))
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    comm_thread.close()  # as the worker does: the thread ends before the process group
    end_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
