"""NCCL paths: run where CUDA GPUs are present (`python -m pytest -m gpu`), skipped elsewhere."""
import pytest
import torch

from commlab.api import RunConfig, run
from commlab.engine.launch import resolve_backend

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and NCCL")]


def test_auto_picks_nccl_with_a_gpu_per_rank():
    backend, why = resolve_backend(RunConfig(world_size=torch.cuda.device_count()))
    assert backend == "nccl", why


@pytest.mark.parametrize("hook, wrapper", [("allreduce", "none"), ("bf16", "none"),
                                           ("powersgd", "none"), ("powersgd", "bf16"),
                                           ("batched_powersgd", "none")])
def test_hooks_run_on_nccl(tmp_path, hook, wrapper):
    r = run(RunConfig(hook=hook, wrapper=wrapper, backend="nccl", world_size=torch.cuda.device_count(),
                      workload="mlp", steps=12, start_powerSGD_iter=2, runs_dir=str(tmp_path)),
            timeout=300)
    assert r.status() == "finished", r.status_record()
    meta = r.meta()
    assert meta["backend"] == "nccl"
    # On NCCL PyTorch's own hooks work, except batched PowerSGD (its _orthogonalize assertion).
    assert meta["hook_impl"] == ("commlab" if hook == "batched_powersgd" else "stock"), meta
