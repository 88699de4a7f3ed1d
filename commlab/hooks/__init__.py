"""DDP communication hooks: which one runs, and commlab's variants where PyTorch's fail.

As a library, with PyTorch's signatures, for production code on Gloo (the exports use it there)::

    from commlab.hooks import PowerSGDState, powerSGD_hook, batched_powerSGD_hook
    from commlab.hooks import bf16_compress_hook, bf16_compress_wrapper
    from commlab.hooks import quantization_pertensor_hook, quantization_perchannel_hook
    from commlab.hooks import TopKState, topk_hook  # and each compressor's state and hook

``PowerSGDState`` is PyTorch's own class, so a state pickled with PyTorch's hook loads here and back.
Post-local SGD needs nothing of commlab: PyTorch's hook, state and averager work on Gloo once the
state is given subgroups (its row of ``commlab.hook_specs`` says so; the exports write it so).
Importing these needs torch and nothing of the lab (no streamlit, plotly or pandas).  What is
offered here is read off the hook table (``commlab.hook_specs``): each hook's function where
commlab has a variant or the only implementation (PyTorch's name and signature; the lab's blocking
variants stay in ``powersgd``), and its state class.

- ``registry``: config -> (state, hook), PyTorch's where it works on the backend, as each hook's
  row says; pure planning functions for the CLI and the UI.
- ``powersgd``: PowerSGD and batched PowerSGD that are safe on Gloo (PyTorch's state and algorithm).
- ``compress``: the bfloat16 hook and wrapper under names DDP does not refuse without NCCL.
- ``quantization``: PyTorch's uint8 quantization hooks (allgather), working and safe on Gloo.
- ``compressors``: the classic compressors (top-k, random-k, threshold, DGC, QSGD, TernGrad,
  natural compression, signSGD with majority vote, signum, EF-signSGD, 1-bit SGD), one state each.
- ``instrument``: byte counting and timing around any hook.
- ``comm_thread``: the communication thread commlab's PowerSGD issues its collectives from.
- ``futures``: Python callbacks on torch futures, which the exit waits for (an abort otherwise).
- ``pitfalls``: PowerSGD's pitfalls, caught as a run goes.
- ``lightning_ddp``: a Lightning ``DDPStrategy`` that registers its hook on CPU too.
- ``replica``: ``ReplicaAllReduce``, HSDP's all-reduce between replicas by one of these hooks on
  each rank's shards (``FSDPModule.set_all_reduce_hook``).

The names above are resolved on first use (PEP 562), so that importing ``registry``'s planning
functions imports no torch.
"""
from __future__ import annotations

import importlib

from commlab.hook_specs import SPECS, WRAPPER_SPECS

# public name -> the module of this package that defines it: each variant's function, its state
# class (the spec's ``exports``), and the one hook all the compressors share.
_EXPORTS = {name: spec.variant for spec in (*SPECS.values(), *WRAPPER_SPECS.values()) if spec.variant
            for name in (spec.attr, *spec.exports)}
_EXPORTS["compressor_hook"] = f"{__name__}.compressors"
_EXPORTS["ReplicaAllReduce"] = f"{__name__}.replica"  # HSDP's all-reduce between replicas, by a hook
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
