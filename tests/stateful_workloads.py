"""User workloads that keep state in their module, as people's code does: each trains differently
in a process that ran another run before (warm ranks that reuse the process) than in a fresh one.

- ``stream_at_first_use``: the data stream is made the first time ``make`` is called and kept;
  a second run in the same process goes on from where the first one's batches stopped.
- ``draw_at_import``: the model's first layer is drawn from torch's global generator when the
  module is imported; a second run in the same process finds the module imported (no draw) and
  the generator where the first run left it.
- ``cached_model``: the model is built once and cached; a second run in the same process gets
  the first one's trained weights.
"""
from __future__ import annotations

import functools

import torch

from commlab.workloads import mlp, mlp_model

_stream = None


def stream_at_first_use(rank=0, seed=0):
    global _stream
    w = mlp(rank=rank, seed=seed)
    if _stream is None:
        _stream = w.batches()
    return w.model, lambda: _stream


_AT_IMPORT = torch.randn(256, 64)  # torch's global generator, whatever state it is in now


def draw_at_import(rank=0, seed=0):
    w = mlp(rank=rank, seed=seed)
    with torch.no_grad():
        w.model[0].weight.copy_(_AT_IMPORT * 0.1)
    return w.model, w.batches


@functools.cache
def _model():
    torch.manual_seed(0)
    return mlp_model()


def cached_model(rank=0, seed=0):
    w = mlp(rank=rank, seed=seed)
    return _model(), w.batches
