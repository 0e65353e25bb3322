"""CUDA-graph replay of a fixed-shape batched forward, one graph per batch-size bucket.

A forward whose inputs are tensors with a leading batch dimension (and otherwise fixed shapes)
is launch-bound at small batches on a fast GPU: pi0's 10 flow steps over 18 expert layers are
hundreds of small kernels. :class:`BatchGraphs` captures ``fn(*inputs)`` once per bucket size
(the powers of two up to ``max_batch``) and per input shape (the non-batch dimensions: e.g. the
number of cameras a batch carries) into static input/output buffers sharing one memory pool, and
serves a batch of ``n`` by padding it to the next bucket (repeating its last row: rows
are independent in the forwards this is used for), copying the inputs in, replaying the graph and
slicing the first ``n`` rows out.

Contract: ``fn`` must be a function of its tensor arguments (no host synchronisation, no
data-dependent shapes, no RNG), return one tensor with the batch dimension first, and run on
the stream it is called on. The output is a fresh tensor (a copy of the static buffer), so a
later replay never overwrites a result a caller still holds.

A **stateful** ``fn`` (``stateful=True``: it also writes buffers it closes over in place, as the
duplex step writes its sessions' KV) is never padded here, since a repeated row would write
twice: every call must bring a whole bucket (``n`` one of ``sizes``) whose extra rows the caller
made harmless, and the warm-up runs of a capture execute ``fn`` on the example, so a stateful
example must be one whose writes are harmless too (the duplex step's padding rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


def buckets(max_batch: int, step: int = 0) -> tuple[int, ...]:
    """Powers of two below ``max_batch``, then ``max_batch`` itself: 1, 2, 4, ..., max_batch.

    With ``step > 0``: powers of two below ``step``, then every multiple of ``step`` below
    ``max_batch``, then ``max_batch`` (finer buckets where padding a batch costs real work:
    ``buckets(64, 8)`` is 1, 2, 4, 8, 16, 24, ..., 56, 64)."""
    sizes = [1]
    while sizes[-1] * 2 < max_batch and (not step or sizes[-1] * 2 < step):
        sizes.append(sizes[-1] * 2)
    if step:
        sizes.extend(range(step, max_batch, step))
    if max_batch > 1:
        sizes.append(max_batch)
    return tuple(sorted(set(sizes)))


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    output: torch.Tensor


class BatchGraphs:
    """Replays ``fn`` from CUDA graphs captured per batch bucket (see the module docstring)."""

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        max_batch: int,
        warmup_iters: int = 2,
        sizes: tuple[int, ...] | None = None,
        stateful: bool = False,
    ) -> None:
        """``sizes``: the buckets (default :func:`buckets` of ``max_batch``); ``stateful``: see
        the module docstring."""
        self.fn = fn
        self.sizes = sizes or buckets(max_batch)
        self.warmup_iters = warmup_iters
        self.stateful = stateful
        self._graphs: dict[tuple[int, tuple[tuple[int, ...], ...]], _Graph] = {}
        self._pool = None

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def capture(self, example: Sequence[torch.Tensor]) -> None:
        """Capture every bucket for the shapes of one example batch (any batch size; rows are
        repeated). Shapes never captured are captured on first use (a one-off stall)."""
        for size in self.sizes:
            key = _key(size, example)
            if key not in self._graphs:
                self._graphs[key] = self._capture(tuple(_pad(t, size) for t in example))

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        n = inputs[0].shape[0]
        size = next((s for s in self.sizes if s >= n), None)
        if size is None:
            raise ValueError(f"batch of {n} exceeds the captured maximum {self.max_batch}")
        if self.stateful and size != n:
            raise ValueError(f"a stateful batch must be a whole bucket of {self.sizes}, got {n} rows")
        key = _key(size, inputs)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._capture(tuple(_pad(t, size) for t in inputs))
        for static, given in zip(entry.inputs, inputs, strict=True):
            static[:n].copy_(given, non_blocking=True)
            if n < size:
                static[n:].copy_(given[-1:].expand_as(static[n:]), non_blocking=True)
        entry.graph.replay()
        return entry.output[:n].clone()

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> _Graph:
        static = tuple(t.clone() for t in inputs)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph, output = capture(lambda: self.fn(*static), self._pool, self.warmup_iters)
        return _Graph(graph, static, output)


def capture(
    fn: Callable[[], T], pool: tuple[int, int], warmup_iters: int = 2
) -> tuple[torch.cuda.CUDAGraph, T]:
    """``fn()`` captured into a CUDA graph in memory ``pool`` (``torch.cuda.graph_pool_handle()``;
    graphs sharing it must never replay at once), after ``warmup_iters`` eager runs on a side
    stream (the allocator, cuBLAS handles, autotuning and lazy compilation happen off the
    capture). Returns the graph and the capture's output, which every replay rewrites in place.

    The capture forbids unsafe CUDA calls on this thread only (``thread_local``): the kinds loaded
    earlier already serve on their own threads, and a shape first met in service is captured
    while other sessions run."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup_iters):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        output = fn()
    return graph, output


def _key(size: int, inputs: Sequence[torch.Tensor]) -> tuple[int, tuple[tuple[int, ...], ...]]:
    return size, tuple(tuple(t.shape[1:]) for t in inputs)


def _pad(tensor: torch.Tensor, size: int) -> torch.Tensor:
    n = tensor.shape[0]
    if n >= size:
        return tensor[:size]
    return torch.cat([tensor, tensor[-1:].expand(size - n, *tensor.shape[1:])])
