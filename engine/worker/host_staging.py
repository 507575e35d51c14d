"""A step's index tensors (token ids, positions, slots, block tables, lengths) to the GPU in one
copy per dtype from a pinned buffer, not seven pageable copies: a pageable copy is staged through
a driver buffer and blocks the host; a pinned one is a DMA the host need not wait for. On the CPU
the numpy arrays are used as they are (no copy at all)."""

from __future__ import annotations

import numpy as np
import torch


class HostStaging:
    def __init__(self, device: str, pack: bool | None = None) -> None:
        """pack: stage through one buffer per dtype (default: on CUDA only; a test packs on the CPU)."""
        self.device = device
        self.cuda = device.startswith("cuda")
        self.pack = self.cuda if pack is None else pack
        self._buffers: dict[np.dtype, torch.Tensor] = {}
        self._copied: torch.cuda.Event | None = None  # the latest copy out of the buffers

    def upload(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """Each array on the device, same dtype and shape (int32 and int64 only)."""
        if not self.pack:
            return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        if self._copied is not None:  # the host must not overwrite a buffer a copy still reads
            self._copied.synchronize()
        moved_of: dict[int, torch.Tensor] = {}  # each array's place in the copy
        for dtype in {a.dtype for a in arrays}:
            members = [i for i, a in enumerate(arrays) if a.dtype == dtype]
            total = sum(arrays[i].size for i in members)
            host = self._buffer(dtype, total)
            view, offset = host.numpy(), 0
            for i in members:
                view[offset : offset + arrays[i].size] = arrays[i].ravel()
                offset += arrays[i].size
            # non_blocking from pinned memory: the copy is queued and the host goes on
            moved = host[:total].to(self.device, non_blocking=True) if self.cuda else host[:total].clone()
            offset = 0
            for i in members:
                moved_of[i] = moved[offset : offset + arrays[i].size].view(arrays[i].shape)
                offset += arrays[i].size
        if self.cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()
        return [moved_of[i] for i in range(len(arrays))]

    def _buffer(self, dtype: np.dtype, size: int) -> torch.Tensor:
        found = self._buffers.get(dtype)
        if found is None or found.numel() < size:
            grown = max(size, 2 * found.numel() if found is not None else 4096)
            found = torch.empty(grown, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype, pin_memory=self.cuda)
            self._buffers[dtype] = found
        return found
