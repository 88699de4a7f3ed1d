"""A Lightning ``DDPStrategy`` that registers its communication hook on every device.

Lightning 2.x registers ``ddp_comm_hook`` only when the strategy's root device is CUDA
(``DDPStrategy._register_ddp_hooks`` in ``lightning/pytorch/strategies/ddp.py``): on CPU, with
Gloo, it silently trains with DDP's plain allreduce.  PyTorch's hooks run on Gloo too (commlab's
variants where PyTorch's fail there), so this subclass drops the device check::

    from commlab.hooks import PowerSGDState, powerSGD_hook
    from commlab.hooks.lightning_ddp import AnyDeviceDDPStrategy

    strategy = AnyDeviceDDPStrategy(ddp_comm_state=PowerSGDState(None, start_powerSGD_iter=10),
                                    ddp_comm_hook=powerSGD_hook)
    trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy)

For post-local SGD it also makes the local subgroups, ``localsgd_subgroup_size`` ranks each, once
the process group exists and before the hook is registered: a ``PostLocalSGDState`` built before
``Trainer.fit`` cannot hold them (no group yet), and left with ``subgroup=None`` PyTorch's hook
makes one subgroup per machine on its first local step, which raises ``ValueError`` without CUDA.
Lightning's own ``model_averaging_period`` then averages the parameters after each optimizer step.

On CUDA it behaves as ``DDPStrategy`` (and makes those subgroups).  Importing it needs Lightning
(``lightning`` or ``pytorch_lightning`` is not a dependency of commlab).
"""
from __future__ import annotations

import torch.distributed as dist
from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook
from lightning.pytorch.strategies import DDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState
from torch.nn.parallel import DistributedDataParallel

__all__ = ["AnyDeviceDDPStrategy"]


class AnyDeviceDDPStrategy(DDPStrategy):
    """``DDPStrategy`` whose ``ddp_comm_hook``, state and wrapper are registered on CPU as on CUDA;
    ``localsgd_subgroup_size`` (post-local SGD only) makes its state's subgroups before that."""

    def __init__(self, *args, localsgd_subgroup_size: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if localsgd_subgroup_size is not None:
            state = self._ddp_comm_state
            if not isinstance(state, PostLocalSGDState) or state.subgroup is not None:
                raise ValueError("localsgd_subgroup_size makes a PostLocalSGDState's subgroups: "
                                 "ddp_comm_state must be a PostLocalSGDState with subgroup=None, "
                                 f"got {type(state).__name__}")
            if isinstance(localsgd_subgroup_size, bool) or not isinstance(localsgd_subgroup_size, int) \
                    or localsgd_subgroup_size < 1:
                raise ValueError("localsgd_subgroup_size must be a whole number of at least 1, got "
                                 f"{localsgd_subgroup_size!r}")
        self._localsgd_subgroup_size = localsgd_subgroup_size

    def _register_ddp_hooks(self) -> None:
        assert isinstance(self.model, DistributedDataParallel)
        if self._localsgd_subgroup_size is not None and self._ddp_comm_state.subgroup is None:
            # every rank reaches this in the same order: new_subgroups is collective
            self._ddp_comm_state.subgroup, _ = dist.new_subgroups(group_size=self._localsgd_subgroup_size)
        _register_ddp_comm_hook(model=self.model, ddp_comm_state=self._ddp_comm_state,
                                ddp_comm_hook=self._ddp_comm_hook,
                                ddp_comm_wrapper=self._ddp_comm_wrapper)
