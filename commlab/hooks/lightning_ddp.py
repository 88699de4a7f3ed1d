"""A Lightning ``DDPStrategy`` that registers its communication hook on every device.

Lightning 2.x registers ``ddp_comm_hook`` only when the strategy's root device is CUDA
(``DDPStrategy._register_ddp_hooks`` in ``lightning/pytorch/strategies/ddp.py``): on CPU, with
Gloo, it silently trains with DDP's plain allreduce.  PyTorch's hooks run on Gloo too (commlab's
variants where PyTorch's fail there), so this subclass drops the device check and nothing else::

    from commlab.hooks import PowerSGDState, powerSGD_hook
    from commlab.hooks.lightning_ddp import AnyDeviceDDPStrategy

    strategy = AnyDeviceDDPStrategy(ddp_comm_state=PowerSGDState(None, start_powerSGD_iter=10),
                                    ddp_comm_hook=powerSGD_hook)
    trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy)

On CUDA it behaves exactly as ``DDPStrategy``.  Importing it needs Lightning (``lightning`` or
``pytorch_lightning`` is not a dependency of commlab).
"""
from __future__ import annotations

from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook
from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

__all__ = ["AnyDeviceDDPStrategy"]


class AnyDeviceDDPStrategy(DDPStrategy):
    """``DDPStrategy`` whose ``ddp_comm_hook``, state and wrapper are registered on CPU as on CUDA."""

    def _register_ddp_hooks(self) -> None:
        assert isinstance(self.model, DistributedDataParallel)
        _register_ddp_comm_hook(model=self.model, ddp_comm_state=self._ddp_comm_state,
                                ddp_comm_hook=self._ddp_comm_hook,
                                ddp_comm_wrapper=self._ddp_comm_wrapper)
