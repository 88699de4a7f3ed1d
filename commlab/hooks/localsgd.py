"""Post-local SGD as PyTorch documents it: ``post_localSGD_hook`` with a ``PostLocalSGDState``,
and a ``PeriodicModelAverager`` that the worker calls after every optimizer step.

PyTorch's hook issues its one allreduce from the hook body, so it is safe on Gloo and runs as it is.
Its state's default subgroup (``subgroup=None``: one subgroup per machine, made on the first local
step by ``dist.new_subgroups()``) raises ``ValueError: Default group size only takes effect when
CUDA is available`` without CUDA, and on one machine it would be every rank, which is no local SGD
at all; so the subgroups are made here, before training, with ``localsgd_subgroup_size`` ranks
each (1: every rank alone between averagings).  The averager allreduces the flattened parameters
through ``dist.all_reduce``, where the byte counter sees it.
"""
from __future__ import annotations

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from commlab.config import RunConfig


def state_kwargs(cfg: RunConfig) -> dict:
    """PostLocalSGDState's keywords from the settings table (the exports spell them too)."""
    return {"start_localSGD_iter": cfg.start_localSGD_iter,
            "post_local_gradient_allreduce": cfg.post_local_gradient_allreduce}


def averager_kwargs(cfg: RunConfig) -> dict:
    """PeriodicModelAverager's keywords from the settings table (the exports spell them too)."""
    return {"period": cfg.averager_period, "warmup_steps": cfg.averager_warmup_steps}


def make_state(cfg: RunConfig, process_group=None) -> PostLocalSGDState:
    """The hook's state; every rank must call it, in the same order (it creates process groups)."""
    subgroup, _ = dist.new_subgroups(group_size=cfg.localsgd_subgroup_size)
    return PostLocalSGDState(process_group, subgroup, **state_kwargs(cfg))


def make_averager(cfg: RunConfig, process_group=None) -> PeriodicModelAverager:
    """Averages the parameters over ``process_group`` every ``averager_period`` steps after the
    warm-up; ``average_parameters(params)`` goes after ``optimizer.step()``."""
    return PeriodicModelAverager(**averager_kwargs(cfg), process_group=process_group)
