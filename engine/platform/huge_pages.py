"""Host memory on transparent huge pages, for the CPU KV cache.

A decode step reads every running sequence's KV blocks, which lie anywhere in a cache of
hundreds of MB: with 4 KiB pages nearly every 2 KiB block costs a TLB miss once a long-running
server's blocks are scattered (measured here: a batch-64 decode's attention over shuffled blocks
15% faster on 2 MiB pages; the engine bench's blocks, nearly in order, ran the same). Linux gives huge
pages to an anonymous private mapping that asks for them (madvise), with THP set to `madvise` or
`always`, as on this machine; elsewhere the same mapping works on ordinary pages. The pages are
touched here, once, as torch.zeros would: left to fault in as blocks are first written, each 2 MiB
page's zeroing (and the kernel's compaction to find one) landed inside the first steps, and made
the engine bench's first prefill 1 s slower.

That touch is why it is opt-in (EngineConfig.huge_pages, on in `make bench`): these VMs hand idle
memory back to their host, and the host backs a 2 MiB page afresh on its first touch. Measured
2026-12-02 after 15 s idle: a 1,454 MB cache took 5.2-5.6 s to zero on huge pages (9.7 s with
MADV_POPULATE_WRITE), against 0.4 s on 4 KiB pages. Faulting them in from a background thread
instead slowed the server's first request from 0.2 s to 4-6 s, however the thread was run."""

from __future__ import annotations

import math
import mmap

import torch

HUGE_PAGE = 2 * 1024 * 1024


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor of this shape on a huge-page-aligned anonymous mapping (which the
    tensor keeps alive)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(region, dtype=torch.uint8)  # holds a reference to region
    skip = -raw.data_ptr() % HUGE_PAGE
    return raw[skip : skip + nbytes].zero_().view(dtype).view(shape)
