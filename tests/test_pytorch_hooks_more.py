"""PyTorch's other hooks (quantization by allgather, post-local SGD) and commlab's compressors on
real Gloo ranks: every one trains with several buckets at 2 and 3 ranks and keeps the replicas
identical (post-local SGD: right after each averaging), with its bytes counted by the one counter;
PyTorch's quantization hooks still fail the way the registry says, and commlab's equal them where
they are made to work (one bucket, the gathered tensors stacked as they index them).

One job per world size runs every hook in one process group (start-up costs seconds here)."""
import math

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import quantization_hooks as stock_quantization
from torch.nn.parallel import DistributedDataParallel as DDP

from commlab.config import RunConfig
from commlab.engine.ranks import run_ranks
from commlab.hook_specs import COMPRESSOR, LOCAL_SGD, QUANTIZATION, hooks_of
from commlab.hooks import quantization, registry
from commlab.hooks.instrument import OTHER, CollectiveCounter

pytestmark = pytest.mark.timeout(600)
STEPS = 3  # DDP rebuilds its buckets after step 0: two steps on the rebuilt layout
LOCALSGD_STEPS = 5  # global up to step 2, averaged at steps 2 and 4
NEW_HOOKS = hooks_of(QUANTIZATION) + hooks_of(LOCAL_SGD) + hooks_of(COMPRESSOR)
FULL_BYTES = 4 * (64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10)  # float32 gradients, one step


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


def _flat(ddp) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])


def _equal_across_ranks(t: torch.Tensor) -> bool:
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])


def _batch(g: torch.Generator):
    return torch.randn(16, 64, generator=g), torch.randint(10, (16,), generator=g)


def _train(cfg: RunConfig, counter: CollectiveCounter, rank: int) -> dict:
    ddp = DDP(_model(), bucket_cap_mb=cfg.bucket_cap_mb)
    choice = registry.choose(cfg, "gloo")
    ddp.register_comm_hook(choice.state, choice.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    counter.reset()
    equal_after = []
    for _ in range(LOCALSGD_STEPS if choice.averager else STEPS):
        x, y = _batch(g)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if choice.averager:
            choice.averager.average_parameters(ddp.parameters())
        with counter.category(OTHER):  # the check's own allgather is not the hook's
            equal = _equal_across_ranks(_flat(ddp))
        equal_after.append((counter.take()[0]["hook"], equal))
    sizes = str(ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", ""))
    return {"hook": cfg.hook, "impl": choice.impl,  "name": choice.name, "buckets": len(sizes.split(",")),
            "bytes": [b for b, _ in equal_after], "equal": [e for _, e in equal_after],
            "finite": bool(torch.isfinite(_flat(ddp)).all())}


class _StackedFuture:
    """A Work whose future holds the gathered tensors stacked, as PyTorch's quantization hooks
    index it (``fut.wait()[0][rank]`` and ``[rank, 0, :]``)."""

    def __init__(self, work):
        self._work = work

    def get_future(self):
        return self._work.get_future().then(lambda f: [torch.stack(f.value())])

    def wait(self):
        return self._work.wait()


def _grads_after_one_step(hook, rank: int) -> torch.Tensor:
    ddp = DDP(_model(), bucket_cap_mb=25)  # one bucket: PyTorch's callback chain cannot deadlock
    ddp.register_comm_hook(None, hook)
    x, y = _batch(torch.Generator().manual_seed(100 + rank))
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in ddp.parameters()])


def _stock_checks(rank: int) -> dict:
    """PyTorch's quantization hooks: the cause of their failure, and commlab's equal to them."""
    out = {}
    try:
        _grads_after_one_step(stock_quantization.quantization_pertensor_hook, rank)
        out["stock_error"] = None
    except RuntimeError as e:
        out["stock_error"] = str(e)
    original = dist.all_gather

    def old_all_gather(*args, **kwargs):
        work = original(*args, **kwargs)
        return _StackedFuture(work) if work is not None else None

    for name in ("quantization_pertensor_hook", "quantization_perchannel_hook"):
        dist.all_gather = old_all_gather
        try:
            theirs = _grads_after_one_step(getattr(stock_quantization, name), rank)
        finally:
            dist.all_gather = original
        ours = _grads_after_one_step(getattr(quantization, name), rank)
        out[name] = torch.equal(theirs, ours)
    return out


def _job(rank: int, world_size: int, report) -> None:
    counter = CollectiveCounter(world_size=world_size).install()
    results = {"stock": _stock_checks(rank) if world_size == 2 else None, "runs": []}
    for hook in NEW_HOOKS:
        cfg = RunConfig(hook=hook, world_size=world_size, bucket_cap_mb=0.02, compress_ratio=0.05,
                        sparsify_threshold=1e-3, start_localSGD_iter=2, averager_warmup_steps=2,
                        averager_period=2, localsgd_subgroup_size=1)
        assert not cfg.errors(gpu_count=0), cfg.errors(gpu_count=0)
        results["runs"].append(_train(cfg, counter, rank))
    counter.uninstall()
    report((rank, results))


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_new_hooks_train_on_gloo_with_several_buckets(world_size):
    reports = run_ranks(_job, world_size, timeout_s=500, collective_timeout_s=60,
                        preload=("torch._dynamo",))
    results = dict(reports)[0]
    runs = {r["hook"]: r for r in results["runs"]}
    assert set(runs) == set(NEW_HOOKS)
    for hook, r in runs.items():
        assert r["buckets"] >= 2 and r["finite"], r
        assert r["impl"] == ("stock" if hook == "post_localsgd" else "commlab"), r
        if hook == "post_localsgd":
            # gradients allreduced up to step 2, then every rank alone; averaged at steps 2 and 4
            assert r["equal"] == [True, True, True, False, True], r
            assert r["bytes"][3] == 0, r  # one-rank subgroups send nothing
            assert r["bytes"][2] == r["bytes"][0] == FULL_BYTES, r  # parameters = gradients in size
        else:
            assert all(r["equal"]), r
            assert all(b > 0 for b in r["bytes"]), r  # every step communicates, counted by the counter
    # honest ratios: an allgather from N ranks counts N * s / 2 (signs: N * n / 16 bytes)
    signs = runs["signsgd"]["bytes"][-1]
    assert signs == pytest.approx(world_size * sum(math.ceil(n / 8) for n in (71208 // 4, 33280 // 4)) / 2, abs=2)
    for hook in ("topk", "randomk", "dgc", "signsgd", "ef_signsgd", "onebit", "terngrad", "qsgd"):
        assert runs[hook]["bytes"][-1] < FULL_BYTES / 4, runs[hook]
    if results["stock"]:
        stock = results["stock"]
        assert "IndexError" in stock["stock_error"], stock  # the cause the registry names
        assert stock["quantization_pertensor_hook"] and stock["quantization_perchannel_hook"], stock
