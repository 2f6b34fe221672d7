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


def pack(batch: dict[str, Any], buffer: torch.Tensor | None = None
         ) -> tuple[torch.Tensor, dict[str, Any]]:
    """``(buffer, layout)``: every tensor of ``batch`` (nested dicts included) written into
    one uint8 tensor — ``buffer`` when it is large enough (``packed_size``), else a new one
    in shared memory — and what ``unpack`` needs to view them again."""
    layout, size, tensors = _plan(batch)
    if buffer is None or buffer.numel() < size:
        buffer = torch.empty(max(size, ALIGN), dtype=torch.uint8).share_memory_()
    for offset, v in tensors:
        _view(buffer, offset, v.dtype, tuple(v.shape)).copy_(v)
    return buffer, layout


def packed_size(batch: dict[str, Any]) -> int:
    """The bytes ``pack`` needs for ``batch``."""
    return _plan(batch)[1]


def _plan(batch: dict[str, Any]) -> tuple[dict[str, Any], int, list[tuple[int, torch.Tensor]]]:
    tensors: list[tuple[int, torch.Tensor]] = []
    size = 0

    def plan(d: dict[str, Any]) -> dict[str, Any]:
        nonlocal size
        out: dict[str, Any] = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out[k] = (DICT, plan(v))
            elif isinstance(v, torch.Tensor):
                if v.device.type != "cpu":
                    raise ValueError(f"batch key {k!r}: a {v.device} tensor; the batch builder "
                                     f"hands over host tensors only")
                tensors.append((size, v))
                out[k] = (TENSOR, size, v.dtype, tuple(v.shape))
                size = _aligned(size + v.numel() * v.element_size())
            else:
                out[k] = (VALUE, v)
        return out

    layout = plan(batch)
    return layout, size, tensors


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
