"""PyTorch's quantization hooks (uint8 by allgather), working on torch 2.13 and safe on Gloo.

PyTorch's ``quantization_pertensor_hook`` and ``quantization_perchannel_hook`` (torch 2.13) fail
on every backend at their first step: they index the allgather future's value as if its first
item stacked every rank's tensor (``fut.wait()[0][rank][0]``, ``[rank, 0, :]``), while a future
of ``dist.all_gather`` holds the list of gathered tensors, so ``[0]`` is rank 0's scale and zero
point and indexing it raises (per tensor: ``IndexError: invalid index of a 0-dim tensor``, or
``index 2 is out of bounds`` on three ranks; per channel no step completed within 60 s, and
given the gathered list nested as older futures held it, ``TypeError: list indices must be
integers or slices, not tuple``).  They also issue their second allgather from inside a future callback and block there,
the pattern that deadlocks or mismatches collectives on Gloo with several buckets (see
``commlab.hooks.powersgd``).

Here the algorithm is PyTorch's, with its own observers and quantize/dequantize helpers: allgather
every rank's scale and zero point and wait for it in the hook body, quantize this rank's bucket
with its own, allgather the uint8 codes, and return the future ``.then`` a callback that
dequantizes each rank's codes with that rank's parameters and averages them, communicating
nothing.  Collectives are called as ``dist.all_gather`` through the module attribute, where the
byte counter can patch it.
"""
# No `from __future__ import annotations`: DDP compares a hook's annotations with real types.

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.quantization_hooks import (
    _dequantize_per_channel_backend,
    _dequantize_per_tensor_backend,
    _get_allgather_out_list,
    _quantize_per_channel_backend,
    _quantize_per_tensor_backend,
)

from commlab.hooks import futures
from commlab.hooks.groups import group_of

__all__ = ["quantization_pertensor_hook", "quantization_perchannel_hook"]


def _group_rank_size(process_group):
    group = group_of(process_group)
    rank = process_group.rank() if process_group is not None else dist.get_rank()
    return group, rank, group.size()


def _gather(tensor: torch.Tensor, group, world_size: int) -> tuple[list, torch.futures.Future]:
    out = _get_allgather_out_list(tensor, world_size)
    return out, dist.all_gather(out, tensor, group=group, async_op=True).get_future()


def quantization_pertensor_hook(
    process_group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """``quantization_pertensor_hook``: one scale and zero point per bucket, uint8 codes."""
    group, rank, world_size = _group_rank_size(process_group)
    tensor = bucket.buffer()
    observer = torch.ao.quantization.MinMaxObserver().to(tensor.device)
    observer(tensor)
    s, z = observer.calculate_qparams()
    s_and_z = torch.FloatTensor([s, z]).to(tensor.device)
    all_s_and_z, fut = _gather(s_and_z, group, world_size)
    fut.wait()  # in the body: the next collective is issued here too, in bucket order
    quantized = _quantize_per_tensor_backend(tensor, all_s_and_z[rank][0], all_s_and_z[rank][1])
    all_quantized, fut = _gather(quantized, group, world_size)

    def dequantize_and_aggregate(fut):
        aggregated = torch.zeros_like(all_quantized[0], device=tensor.device, dtype=torch.float32)
        for r, q in enumerate(all_quantized):
            aggregated += _dequantize_per_tensor_backend(q, all_s_and_z[r][0], all_s_and_z[r][1])
        return aggregated / world_size

    return futures.then(fut, dequantize_and_aggregate)


def quantization_perchannel_hook(
    process_group: dist.ProcessGroup, bucket: dist.GradBucket, bucket_size=512
) -> torch.futures.Future[torch.Tensor]:
    """``quantization_perchannel_hook``: the bucket cut into channels of ``bucket_size`` elements,
    each with its own scale and zero point."""
    group, rank, world_size = _group_rank_size(process_group)
    tensor = bucket.buffer()
    channels = nn.functional.pad(input=tensor, pad=(0, bucket_size - len(tensor) % bucket_size),
                                 mode="constant", value=0).view(-1, bucket_size).to(tensor.device)
    observer = torch.ao.quantization.PerChannelMinMaxObserver().to(tensor.device)
    observer(channels)
    s_ch, z_ch = observer.calculate_qparams()
    s_and_z = torch.stack((s_ch, z_ch)).to(tensor.device)
    all_s_and_z, fut = _gather(s_and_z, group, world_size)
    fut.wait()
    quantized = _quantize_per_channel_backend(channels, all_s_and_z[rank][0, :], all_s_and_z[rank][1, :])
    all_quantized, fut = _gather(quantized, group, world_size)

    def dequantize_and_aggregate(fut):
        aggregated = torch.zeros_like(all_quantized[0], device=tensor.device, dtype=torch.float32)
        for r, q in enumerate(all_quantized):
            aggregated += _dequantize_per_channel_backend(q, all_s_and_z[r][0], all_s_and_z[r][1])
        return torch.flatten(aggregated).to(tensor.device)[: tensor.size()[0]] / world_size

    return futures.then(fut, dequantize_and_aggregate)
