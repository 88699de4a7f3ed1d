"""PowerSGD hooks that are safe on Gloo: PyTorch's algorithm, state and seeds, collectives in order.

PyTorch's ``powerSGD_hook`` (torch 2.13) issues its P and Q allreduces from inside future callbacks
and blocks there with ``.wait()``. Gloo runs callbacks on its two worker threads: with two buckets
both threads block (deadlock); otherwise the callbacks of different buckets issue collectives in a
different order on each rank (collective mismatch). Here every collective is issued from the hook
body: launch the uncompressed and the P allreduce, ``wait()`` for both in the body, launch the Q
allreduce and return its future ``.then(decompress)``, where ``decompress`` communicates nothing.
DDP calls hooks in bucket order on every rank, so every rank issues the same collectives in the same
order.

Waiting in the body stops backward.  So ``powerSGD_hook`` hands its body to the process's
communication thread (``commlab.hooks.comm_thread``), which runs the bodies in the order DDP
called the hooks, and returns at once: backward goes on while the thread waits.  The body stops
after launching the uncompressed and P allreduces and leaves the rest (Q = MᵀP and its
allreduce, a ``comm_thread.Deferred``) for the thread to run once the next bucket's have gone
out, so that two buckets' round trips overlap.  ``blocking_powerSGD_hook`` runs the same body in
the hook (the lab's ``overlap`` off, for comparison); the numbers are the same either way.  Both
keep PyTorch's signature, ``(state, bucket)``.

PyTorch's ``batched_powerSGD_hook`` hands a 2-D matrix to ``_orthogonalize``, which asserts a 3-D
batch since batching by shape was added; here the matrix is orthogonalized as a batch of one.

The state is PyTorch's own ``PowerSGDState``, so its fields, ``compression_stats()`` and the random
seeds drawn from ``state.rng`` are the same as with the stock hooks.  Collectives are called as
``dist.all_reduce`` through the module attribute, where a byte counter can patch it.
"""
# No `from __future__ import annotations`: DDP compares a hook's annotations with dist.GradBucket
# and Future[Tensor] objects and refuses the hook when they are strings.

import math
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    _orthogonalize,
    _report_compression_stats,
)

from commlab.analysis.rule import decide
from commlab.hooks import comm_thread, futures
from commlab.hooks.groups import group_of

__all__ = ["PowerSGDState", "powerSGD_hook", "batched_powerSGD_hook", "blocking_powerSGD_hook",
           "blocking_batched_powerSGD_hook"]


def _launch(tensor: torch.Tensor, group: dist.ProcessGroup) -> dist.Work:
    return dist.all_reduce(tensor, group=group, async_op=True)


def _vanilla(state: PowerSGDState, bucket: dist.GradBucket,
             group: dist.ProcessGroup) -> torch.futures.Future[torch.Tensor]:
    """Averaging allreduce, run before ``start_powerSGD_iter``; divides first, as PyTorch does."""
    state.maybe_increase_iter(bucket)
    tensor = bucket.buffer().div_(group.size())
    return futures.then(_launch(tensor, group).get_future(), lambda fut: fut.value()[0])


def _add_error(state: PowerSGDState, bucket_index: int, tensor: torch.Tensor) -> torch.Tensor | None:
    """Fold last step's local error into ``tensor``; return the copy the new error is measured from."""
    if not state.use_error_feedback:
        return None
    if bucket_index in state.error_dict:
        tensor.add_(state.error_dict[bucket_index])
    else:
        state.error_dict[bucket_index] = torch.zeros_like(tensor)
    return tensor.detach().clone()


def _random_fill(state: PowerSGDState, matrices: list[torch.Tensor]) -> None:
    """Fill with N(0, 1) from one seed drawn from ``state.rng``: the same on every rank, new each time.

    PyTorch seeds the global CPU RNG inside ``fork_rng``; a generator of its own, seeded alike,
    draws the same values (on the CPU, as PyTorch's) and leaves the global RNG alone even while
    this runs on the communication thread beside training.
    """
    generator = torch.Generator().manual_seed(state.rng.randint(1_000_000_000))
    for m in matrices:
        m.copy_(torch.randn(*m.shape, device="cpu", dtype=m.dtype, generator=generator))


def _finish_state(state: PowerSGDState, bucket: dist.GradBucket, bucket_index: int,
                  original: torch.Tensor | None, decompressed: torch.Tensor) -> None:
    """The bookkeeping that ends a compressed step; it communicates nothing."""
    if decompressed.is_cuda:
        # PyTorch synchronizes here too: the error below must see the finished decompression.
        torch.cuda.synchronize(decompressed.device)
    if state.use_error_feedback:
        state.error_dict[bucket_index] = original - decompressed
    if not state.warm_start:
        state.p_memory_dict.clear()
        state.q_memory_dict.clear()
    state.maybe_increase_iter(bucket)


def _blocking(body, name: str):
    """The hook ``name`` that runs ``body`` in place: it waits in the hook for its collectives."""

    def hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return comm_thread.run_in_place(lambda: body(state, bucket))

    hook.__name__ = hook.__qualname__ = name
    hook.__doc__ = body.__doc__
    return hook


def _overlapped(body, name: str):
    """The hook ``name`` that runs ``body`` on the communication thread."""

    def hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        comm = comm_thread.current()
        last = bucket.is_last()
        fut = comm.submit(lambda: body(state, bucket), tag=bucket.index(), last=last)
        if last:
            # DDP may issue a collective of its own once the last hook returns (the map of used
            # parameters, with find_unused_parameters): this step's must all be out before it.
            # Backward has nothing left to compute by now; it would wait for them anyway.
            comm.wait_idle()
        return fut

    hook.__name__ = hook.__qualname__ = name
    hook.__doc__ = body.__doc__
    return hook


def _powersgd(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Layer-wise PowerSGD, step for step PyTorch's ``powerSGD_hook``, with collectives in order.

    1. Split the bucket's gradients by the compression rule (``commlab.analysis.rule.decide``).
    2. Allreduce the uncompressed tensors as one contiguous batch and average them.
    3. For each compressed matrix M: Q (warm-started or random, orthogonalized), P = MQ;
       allreduce the Ps; orthogonalize; Q = MᵀP; allreduce the Qs; M ≈ PQᵀ / world size.
    Before ``start_powerSGD_iter`` it is a plain averaging allreduce.
    """
    group = group_of(state.process_group)
    world_size = group.size()
    input_tensor = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        return _vanilla(state, bucket, group)

    device, dtype = input_tensor.device, input_tensor.dtype
    bucket_index = bucket.index()
    original = _add_error(state, bucket_index, input_tensor)

    to_compress, uncompressed = [], []
    ps_size = qs_size = 0
    for tensor in bucket.gradients():
        d = decide("", tensor.shape, state.matrix_approximation_rank, state.min_compression_rate)
        state.total_numel_before_compression += d.numel_before
        state.total_numel_after_compression += d.numel_after
        if d.compressed:
            to_compress.append(tensor.view(d.n, d.m))
            ps_size += d.n * d.r
            qs_size += d.m * d.r
        else:
            uncompressed.append(tensor)
    _report_compression_stats(bucket, state)

    uncompressed_memory = (torch.cat([t.view(-1) for t in uncompressed]) if uncompressed
                           else torch.tensor([], device=device, dtype=dtype))
    # Launched before computing the Ps, which it overlaps; PyTorch launches it after, as its
    # callback chain would otherwise need a second branch.
    uncompressed_work = _launch(uncompressed_memory, group)

    # Later steps read P and Q through these names, never the dicts: without warm start, another
    # bucket's decompress() may clear the dicts while this bucket is still working.
    randomize = not state.warm_start or bucket_index not in state.p_memory_dict
    if randomize:
        p_memory = torch.empty(ps_size, device=device, dtype=dtype)
        q_memory = torch.empty(qs_size, device=device, dtype=dtype)
        state.p_memory_dict[bucket_index] = p_memory
        state.q_memory_dict[bucket_index] = q_memory
    else:
        p_memory = state.p_memory_dict[bucket_index]
        q_memory = state.q_memory_dict[bucket_index]

    # Same-shaped matrices may be stacked into one batch (batch_tensors_with_same_shape).
    shape_to_tensors = defaultdict(list)
    for matrix in to_compress:
        shape_to_tensors[matrix.shape].append(matrix)
    batches = []
    for same_shape in shape_to_tensors.values():
        if state.batch_tensors_with_same_shape and len(same_shape) > 1:
            batches.append(torch.stack(same_shape))
        else:
            batches.extend(m.unsqueeze(0) for m in same_shape)

    ps, qs = [], []
    p_idx = q_idx = 0
    for batch in batches:
        batch_size, n, m = batch.shape
        r = min(n, m, state.matrix_approximation_rank)
        ps.append(p_memory[p_idx:p_idx + batch_size * n * r].view(batch_size, n, r))
        qs.append(q_memory[q_idx:q_idx + batch_size * m * r].view(batch_size, m, r))
        p_idx += batch_size * n * r
        q_idx += batch_size * m * r

    if randomize:
        _random_fill(state, qs)
    for q in qs:
        _orthogonalize(q, state.orthogonalization_epsilon)
    for batch, q, p in zip(batches, qs, ps):
        torch.bmm(batch, q, out=p)

    # The Ps are orthogonalized next, so their sum needs no division by the world size.  Both
    # allreduces are in flight together: the P one need not wait for the other's round trip.
    p_work = _launch(p_memory, group)

    def unpack_uncompressed_and_compute_qs() -> torch.futures.Future[torch.Tensor]:
        uncompressed_work.wait()
        uncompressed_memory.div_(world_size)
        idx = 0
        for tensor in uncompressed:
            tensor.copy_(uncompressed_memory[idx:idx + tensor.numel()].view_as(tensor))
            idx += tensor.numel()

        p_work.wait()
        for p in ps:
            _orthogonalize(p, state.orthogonalization_epsilon)
        for batch, p, q in zip(batches, ps, qs):
            torch.bmm(batch.transpose(1, 2), p, out=q)
        return futures.then(_launch(q_memory, group).get_future(), decompress)

    def decompress(_: torch.futures.Future) -> torch.Tensor:
        q_memory.div_(world_size)
        for p, q, batch in zip(ps, qs, batches):
            torch.bmm(p, q.transpose(1, 2), out=batch)
        for batch in batches:
            if batch.shape[0] > 1:  # a stacked copy: write it back to the bucket's views
                for original_tensor, approximated in zip(shape_to_tensors[batch.shape[1:]], batch):
                    original_tensor.copy_(approximated)
        _finish_state(state, bucket, bucket_index, original, input_tensor)
        return input_tensor

    # On the communication thread the next bucket's uncompressed and P allreduces go out before
    # this one waits for its own.
    return comm_thread.Deferred(unpack_uncompressed_and_compute_qs)


def _batched_powersgd(state: PowerSGDState,
                      bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PowerSGD on the whole bucket, step for step PyTorch's ``batched_powerSGD_hook``.

    The flat bucket is viewed as a square matrix M padded with zeros, then compressed as one:
    P = MQ; allreduce P; orthogonalize; Q = MᵀP; allreduce Q; M ≈ PQᵀ / world size, truncated
    back to the bucket's length.  Before ``start_powerSGD_iter`` it is a plain averaging allreduce.

    Two deliberate differences from PyTorch's code, neither of which changes a result it can
    produce: the padded matrix is a separate tensor (PyTorch ``resize_``s DDP's bucket buffer in
    place), and ``orthogonalization_epsilon`` is honoured (PyTorch's batched hook never passes it
    on; with the default epsilon of 0 the two are identical).
    """
    group = group_of(state.process_group)
    world_size = group.size()
    input_tensor = bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        return _vanilla(state, bucket, group)

    total_length = input_tensor.shape[0]
    side = math.ceil(math.sqrt(total_length))
    rank = state.matrix_approximation_rank
    state.total_numel_before_compression += total_length
    state.total_numel_after_compression += side * rank * 2
    _report_compression_stats(bucket, state)

    padded = input_tensor.new_zeros(side * side)
    padded[:total_length].copy_(input_tensor)
    bucket_index = bucket.index()
    original = _add_error(state, bucket_index, padded)
    matrix = padded.view(side, side)

    if not state.warm_start or bucket_index not in state.p_memory_dict:
        p = input_tensor.new_empty(side, rank)
        q = input_tensor.new_empty(side, rank)
        _random_fill(state, [q])
        state.p_memory_dict[bucket_index] = p
        state.q_memory_dict[bucket_index] = q
    else:
        p = state.p_memory_dict[bucket_index]
        q = state.q_memory_dict[bucket_index]
    epsilon = state.orthogonalization_epsilon
    _orthogonalize(q.unsqueeze(0), epsilon)
    torch.matmul(matrix, q, out=p)

    p_work = _launch(p, group)

    def compute_q() -> torch.futures.Future[torch.Tensor]:
        p_work.wait()
        _orthogonalize(p.unsqueeze(0), epsilon)
        torch.matmul(matrix.t(), p, out=q)
        return futures.then(_launch(q, group).get_future(), decompress)

    def decompress(_: torch.futures.Future) -> torch.Tensor:
        q.div_(world_size)
        torch.matmul(p, q.t(), out=matrix)
        _finish_state(state, bucket, bucket_index, original, padded)
        input_tensor.copy_(padded[:total_length])
        return input_tensor

    return comm_thread.Deferred(compute_q)


powerSGD_hook = _overlapped(_powersgd, "powerSGD_hook")
batched_powerSGD_hook = _overlapped(_batched_powersgd, "batched_powerSGD_hook")
blocking_powerSGD_hook = _blocking(_powersgd, "blocking_powerSGD_hook")
blocking_batched_powerSGD_hook = _blocking(_batched_powersgd, "blocking_batched_powerSGD_hook")
