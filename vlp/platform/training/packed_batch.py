"""A host batch as one shared-memory buffer and a layout: how the batch builder process
hands its batches to the training process.

One buffer per batch, whatever the number of tensors (a batch has 20-40, more under the
summed objective): the builder reuses its buffers (their pages are mapped in both processes
once), and the receiving side makes one copy out of it (into pinned memory on CUDA). Values
that are not tensors travel in the layout as they are.
"""

from __future__ import annotations

from typing import Any

import torch

ALIGN = 64   # every tensor starts on a cache line (and on its dtype's alignment)

TENSOR, DICT, VALUE = "t", "d", "v"


class Packing:
    """Where each tensor of ``batch`` (nested dicts included) goes in one uint8 buffer:
    ``size`` bytes in all, ``layout`` for ``unpack``; ``write`` copies them into a buffer of at
    least ``size`` bytes."""

    def __init__(self, batch: dict[str, Any]):
        self._tensors: list[tuple[int, torch.Tensor]] = []
        self.size = 0
        self.layout = self._plan(batch)

    def write(self, buffer: torch.Tensor) -> None:
        for offset, v in self._tensors:
            _view(buffer, offset, v.dtype, tuple(v.shape)).copy_(v)

    def _plan(self, d: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out[k] = (DICT, self._plan(v))
            elif isinstance(v, torch.Tensor):
                if v.device.type != "cpu":
                    raise ValueError(f"batch key {k!r}: a {v.device} tensor; the batch builder "
                                     f"hands over host tensors only")
                self._tensors.append((self.size, v))
                out[k] = (TENSOR, self.size, v.dtype, tuple(v.shape))
                self.size = _aligned(self.size + v.numel() * v.element_size())
            else:
                out[k] = (VALUE, v)
        return out


def pack(batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """``(buffer, layout)``: ``batch``'s tensors in a new uint8 tensor in shared memory, and
    what ``unpack`` needs to view them again."""
    packing = Packing(batch)
    buffer = torch.empty(max(packing.size, ALIGN), dtype=torch.uint8).share_memory_()
    packing.write(buffer)
    return buffer, packing.layout


def unpack(buffer: torch.Tensor, layout: dict[str, Any]) -> dict[str, Any]:
    """The batch ``pack`` was given, its tensors views of ``buffer`` (which may be a pinned
    copy of the shared one)."""
    out: dict[str, Any] = {}
    for k, entry in layout.items():
        if entry[0] == DICT:
            out[k] = unpack(buffer, entry[1])
        elif entry[0] == TENSOR:
            out[k] = _view(buffer, entry[1], entry[2], entry[3])
        else:
            out[k] = entry[1]
    return out


def _view(buffer: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...]
          ) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return buffer[offset:offset + n * dtype.itemsize].view(dtype).view(shape)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
