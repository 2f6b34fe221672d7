"""Recording the operations that make the host wait for the device, on any device.

On CUDA, ``torch.cuda.set_sync_debug_mode`` reports them; on a CPU every tensor is host
memory, so nothing waits, and a forward that would stall a GPU runs unnoticed. This recorder
catches them by what they do, not by timing: reading a tensor's value into Python
(``item``, ``int()``/``float()``/``bool()`` of a tensor, ``tolist``, ``numpy``), copying to the
host (``.cpu()``, ``.to("cpu")``), and operations whose output shape depends on the values
(``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``, ``bincount``,
``repeat_interleave`` without an output size) — each of which waits for the device on CUDA;
a tensor made from Python values with a device named (``torch.tensor(…, device=…)``: on
CUDA a copy from pageable host memory, which waits for the stream); and an explicit wait
(``torch.cuda.synchronize``, an event's or a stream's ``synchronize``, DeepSpeed's
``get_accelerator().synchronize()``), which a CPU run executes as nothing.

    with HostSyncRecorder() as syncs:
        out = model(batch, task="mlm")
    assert not syncs.events, syncs.describe()

Two layers: a ``TorchFunctionMode`` sees the Python-level calls (``tolist``, ``numpy``,
``cpu``, a tensor used as a Python scalar) with the caller's file and line; a
``TorchDispatchMode`` sees the aten operations beneath (``_local_scalar_dense`` is what every
scalar read becomes; boolean indexing becomes ``aten.index`` with a bool index, and
``nonzero`` inside it), so a read hidden in a library call is caught too.
"""

from __future__ import annotations

import functools
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Python-level tensor methods that hand a value (or a host copy) to Python
_FUNCTIONS = {
    torch.Tensor.item: "item",
    torch.Tensor.tolist: "tolist",
    torch.Tensor.numpy: "numpy",
    torch.Tensor.cpu: "cpu",
    torch.Tensor.__bool__: "bool()",
    torch.Tensor.__int__: "int()",
    torch.Tensor.__float__: "float()",
    torch.Tensor.__index__: "index()",
    torch.Tensor.nonzero: "nonzero",
    torch.nonzero: "nonzero",
    torch.Tensor.masked_select: "masked_select",
    torch.masked_select: "masked_select",
}

# aten operations whose output needs a value the device computes
_ATEN = {
    "_local_scalar_dense": "scalar read (item/int/float/bool)",
    "nonzero": "nonzero",
    "nonzero_static": None,        # a fixed output size: no sync
    "masked_select": "masked_select",
    "_unique2": "unique",
    "unique_dim": "unique",
    "unique_consecutive": "unique",
    "bincount": "bincount",
    "repeat_interleave": "repeat_interleave",
}


@dataclass
class SyncEvent:
    what: str
    where: str


def _caller() -> str:
    """The innermost frame outside torch and this file: where the model asked for it."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename
        if "/torch/" in name or name.endswith("host_syncs.py"):
            continue
        return f"{name}:{frame.lineno} ({frame.line})"
    return "?"


class _FunctionLayer(TorchFunctionMode):
    def __init__(self, sink: list[SyncEvent]):
        super().__init__()
        self.sink = sink

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        what = _FUNCTIONS.get(func)
        if what is None and func is torch.Tensor.to and isinstance(args[0], torch.Tensor):
            # a copy to the host from another device (to(x.device) on a CPU run is none)
            target = [a for a in args[1:] if isinstance(a, (str, torch.device))]
            target += [kwargs["device"]] if kwargs.get("device") is not None else []
            if any((torch.device(t).type == "cpu") != (args[0].device.type == "cpu")
                   for t in target):
                what = "to(cpu)"
        if what is None and func in (torch.tensor, torch.as_tensor) and \
                kwargs.get("device") is not None and not torch.is_tensor(args[0] if args
                                                                      else None):
            what = "tensor from Python values on a device (a host-to-device copy)"
        if what is None and func is torch.Tensor.__getitem__ and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
                what = "boolean-mask index"
        if what is not None:
            self.sink.append(SyncEvent(what, _caller()))
        return func(*args, **kwargs)


class _DispatchLayer(TorchDispatchMode):
    def __init__(self, sink: list[SyncEvent]):
        super().__init__()
        self.sink = sink

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::", 1)[-1]
        what = _ATEN.get(name)
        if name == "repeat_interleave" and kwargs.get("output_size") is not None:
            what = None
        if name.startswith("index") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for a in args[1:2] if isinstance(a, (list, tuple)) for i in a):
            what = "boolean-mask index"
        if what is not None:
            self.sink.append(SyncEvent(f"aten.{name}: {what}", _caller()))
        return func(*args, **kwargs)


_INHERITED = object()


class _ExplicitWaits:
    """Wraps the calls that wait for the device outright while recording: torch's
    ``cuda.synchronize`` and its events' and streams' ``synchronize``, and the class of
    DeepSpeed's accelerator where DeepSpeed is imported (on a CPU its ``synchronize`` does
    nothing, so only a count can see it)."""

    def __init__(self, sink: list[SyncEvent]):
        self.sink = sink
        self._saved: list[tuple[Any, str, Any]] = []

    def _targets(self) -> list[tuple[Any, str, str]]:
        found = [(torch.cuda, "synchronize", "torch.cuda.synchronize"),
                 (torch.cuda.Event, "synchronize", "cuda.Event.synchronize"),
                 (torch.cuda.Stream, "synchronize", "cuda.Stream.synchronize")]
        accelerator = sys.modules.get("deepspeed.accelerator")
        if accelerator is not None:
            found.append((type(accelerator.get_accelerator()), "synchronize",
                          "deepspeed accelerator synchronize"))
        return found

    def __enter__(self) -> "_ExplicitWaits":
        for owner, name, what in self._targets():
            current = getattr(owner, name, None)
            if current is None:
                continue
            # a class's own attribute is put back; one it inherits is deleted again
            self._saved.append((owner, name, vars(owner).get(name, _INHERITED)))
            setattr(owner, name, self._wrap(current, what))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, own in reversed(self._saved):
            if own is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, own)
        self._saved.clear()

    def _wrap(self, original: Any, what: str) -> Any:
        sink = self.sink

        @functools.wraps(original)
        def waits(*args, **kwargs):
            sink.append(SyncEvent(what, _caller()))
            return original(*args, **kwargs)
        return waits


@dataclass
class HostSyncRecorder:
    """A context manager; ``events`` lists what happened inside it, in order."""

    events: list[SyncEvent] = field(default_factory=list)

    def __enter__(self) -> "HostSyncRecorder":
        self._function = _FunctionLayer(self.events)
        self._dispatch = _DispatchLayer(self.events)
        self._waits = _ExplicitWaits(self.events)
        self._function.__enter__()
        self._dispatch.__enter__()
        self._waits.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._waits.__exit__(*exc)
        self._dispatch.__exit__(*exc)
        self._function.__exit__(*exc)

    def describe(self) -> str:
        return "\n".join(f"{e.what} at {e.where}" for e in self.events)
