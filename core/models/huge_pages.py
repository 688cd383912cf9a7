"""Memory the kernels stream, on 2 MB pages where Linux lends them.

Every forward reads all of a model's packed weights (1 GB for the 1.5B target,
84 MB for the drafter) and a step reads its KV cache. On 4 KB pages each 4 KB
of that stream needs its own address translation, and in a virtual machine a
TLB miss walks two page tables; the hardware prefetcher also stops at every
4 KB boundary. Linux backs anonymous memory with 2 MB pages where a program
asks (madvise MADV_HUGEPAGE; "madvise" is the common default of
/sys/kernel/mm/transparent_hugepage/enabled), but torch's allocator does not ask
for tensors under 2 MB, and the drafter's 121 products are 0.2-1.1 MB each.
Gathered into one 2 MB-aligned block, a drafter forward right after a target
step ran 12% faster and the target's one-token step 9% (git show 524cea4:docs/speed.md, "2 MB
pages"). Elsewhere (another OS, THP off) the same blocks are ordinary memory.
"""

from __future__ import annotations

import math
import mmap
import sys
from collections.abc import Iterable
from typing import Protocol

import torch

from ..heap import trim_heap

HUGE = 2 << 20  # bytes in a huge page (x86-64 and most arm64 kernels)
# Linux's transparent huge pages, asked for with madvise on a private anonymous
# mapping; elsewhere (macOS, Windows: no MADV_HUGEPAGE, nor MAP_ANONYMOUS on
# Windows) blocks are ordinary torch memory.
_ASK_HUGE = sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE")
_LINE = 64  # each tensor starts on a cache line, as torch's allocator starts them


class Placeable(Protocol):
    """A layer whose packed weights can move: .kernel_weights is (packed, layout)
    and place(t) makes t, a copy of them, the layer's own."""

    kernel_weights: tuple[torch.Tensor, int] | None

    def place(self, packed: torch.Tensor) -> None: ...


def block(nbytes: int) -> torch.Tensor:
    """nbytes of zeroed memory as a uint8 tensor, starting on a 2 MB boundary and
    asked for on 2 MB pages; freed when the last tensor viewing it is."""
    if nbytes < HUGE or not _ASK_HUGE:
        return torch.zeros(nbytes, dtype=torch.uint8)
    # Private: a shared anonymous mapping is shmem, which THP leaves on 4 KB pages.
    mapping = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # zero-filled
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # THP compiled out: 4 KB pages, still correct
        pass
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive
    start = -whole.data_ptr() % HUGE
    return whole[start : start + nbytes]


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros(shape, dtype=dtype) on 2 MB pages (a KV cache)."""
    return block(math.prod(shape) * dtype.itemsize).view(dtype).view(shape)


def gather(layers: Iterable[Placeable]) -> None:
    """Copy the layers' packed weights, in order, into one block on 2 MB pages and
    make the copies theirs; what they held is freed as each moves (unless held
    elsewhere too). Layers without packed weights are left alone."""
    moving = [layer for layer in layers if layer.kernel_weights is not None]
    sizes = [-(-layer.kernel_weights[0].numel() // _LINE) * _LINE for layer in moving]
    room = block(sum(sizes))
    room.fill_(0)  # the pages faulted in by a parallel fill: a copy into untouched pages ran slower
    start = 0
    for layer, size in zip(moving, sizes):
        packed = layer.kernel_weights[0]
        if not packed.is_contiguous() or packed.dtype != torch.uint8:
            raise TypeError("packed weights are contiguous bytes")
        copy = room[start : start + packed.numel()].view(packed.shape)
        copy.copy_(packed)
        layer.place(copy)
        start += size
    trim_heap()  # the old copies' pages, freed, go back to the OS
