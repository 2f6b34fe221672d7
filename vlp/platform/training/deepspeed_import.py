"""``import deepspeed`` without the MLflow import its autotuner makes on the side, with its
Muon kernels compiled on their first call instead of as they are imported, and without the
CPU comm op that only its inference uses; its bf16 optimizer built without the memory reports
it forces.

Importing DeepSpeed runs ``deepspeed.autotuning.autotuner``, which imports MLflow when it is
installed, to log the autotuner's own experiments (vlp never runs DeepSpeed's autotuner). On
this platform MLflow is installed everywhere, and its import is ~1.1 s of CPU (its GenAI and
gateway modules, FastAPI): paid by every process that builds an engine — each Ray Train
worker of every run and stage, each `vlp doctor` rank, each local run — while only rank 0's
tracker writes to MLflow, and imports it itself when it does.

``load_deepspeed()`` imports DeepSpeed with a finder that refuses ``mlflow`` to the
autotuner's module alone (its ``try: import mlflow`` then sets ``has_mlflow = False``, as on
a machine without MLflow). The refusal looks at the importing thread's own frames, so another
thread importing MLflow at the same moment gets it as usual; and where MLflow is already
imported, DeepSpeed finds it in ``sys.modules`` as before. Every vlp module that imports from
``deepspeed`` calls this first.

Its Muon optimizer's kernels are imported with their ``torch.compile`` put off to their first
call. DeepSpeed 0.19 imports ``deepspeed.runtime.zero.muon.muon_optimizer`` wherever it asks
whether the optimizer is Muon: in the ZeRO check of every ``deepspeed.initialize``, in the
bf16 optimizer's set-up and in ZeRO-1/2's ``average_tensor`` on the first gradient reduction.
That module's kernels (``original_muon``) are decorated with ``torch.compile`` as they are
imported, which imports dynamo and inductor: ~1.8 s of CPU in every process that builds an
engine (each Ray Train worker of every run and stage, each rank of a local run, each sweep
trial's worker), for an optimizer vlp never uses (AdamW, or SOHO's SGD + AdamW:
``engine.deepspeed_config``). ``load_deepspeed()`` imports those kernels with DeepSpeed's
compile decorator swapped for one that compiles each kernel on its first call, with the same
``torch.compile``; Muon stays whole and its kernels compile when a Muon run first calls them.

DeepSpeed's communication backend (``deepspeed.comm.torch.TorchBackend``) JIT-compiles its
shared-memory comm op (``deepspeed_shm_comm``, C++ against torch's headers) as it starts on
the CPU accelerator: ~50 CPU s (25-30 s on two cores) the first time a machine runs a job,
inside the first engine's ``deepspeed.initialize``, and a C++ compiler and ninja needed on
every CPU node. The op serves one call, ``inference_all_reduce`` (the tensor-parallel layers
of DeepSpeed-Inference and AutoTP, which vlp does not use); every reduction of training
(ZeRO's gradient reductions, ``all_reduce``, ``all_gather``, ``broadcast``) goes through
``torch.distributed``'s gloo on a CPU. ``load_deepspeed()`` replaces the backend's
``build_shm_op`` with one that builds nothing (as on a CPU where the op cannot build, which
DeepSpeed handles the same way): ``inference_all_reduce``, if anything called it, would
reduce through ``torch.distributed`` too. CUDA has no such op; nothing changes there.

``bf16_optimizer_unforced_memory_reports()``, around ``deepspeed.initialize``: DeepSpeed's
bf16 optimizer (vlp's bf16 under ZeRO-1, a GPU run's default) calls its memory report with
``force=True`` four times plus twice per parameter group as it is built; each report is a
full ``gc.collect()`` on rank 0 and three printed lines ("MA … GB", "CPU Virtual Memory").
In a process that has imported torch, transformers and DeepSpeed a full collection is a
fraction of a second, so every bf16 engine build spent ~2 s collecting (11.5 s of the CPU GPU
check's 43 s sampled by py-spy) and wrote twelve lines into the job's log. Inside the
context the reports are unforced: they run when DeepSpeed's own ``memory_breakdown``
setting asks, as its other reports do.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

_AUTOTUNER = "deepspeed.autotuning.autotuner"
_MUON_KERNELS = "deepspeed.runtime.zero.muon.original_muon"


class _NoMlflowForTheAutotuner(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "mlflow":
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_globals.get("__name__") == _AUTOTUNER:
                raise ImportError("mlflow is not imported for DeepSpeed's autotuner "
                                  "(vlp.platform.training.deepspeed_import)")
            frame = frame.f_back
        return None


def load_deepspeed() -> ModuleType:
    """The ``deepspeed`` module, imported (once per process) as the docstring says."""
    deepspeed = sys.modules.get("deepspeed")
    if deepspeed is None:
        finder = _NoMlflowForTheAutotuner()
        sys.meta_path.insert(0, finder)
        try:
            import deepspeed
        finally:
            sys.meta_path.remove(finder)
        _muon_kernels_compiled_on_first_call()
    _no_shm_comm_op()    # also where DeepSpeed was imported before vlp asked (a user's script)
    return deepspeed


def _no_shm_comm_op() -> None:
    """``deepspeed.comm.torch.build_shm_op`` builds nothing (the docstring)."""
    # by its full name: ``deepspeed.comm``'s namespace holds torch itself under ``torch``
    comm_backend = importlib.import_module("deepspeed.comm.torch")
    comm_backend.build_shm_op = _shm_comm_op_not_built


def _shm_comm_op_not_built() -> None:
    """DeepSpeed's ``build_shm_op`` in vlp's processes: no op (``None``, as where the op
    cannot build); see the module docstring."""
    return None


def _muon_kernels_compiled_on_first_call() -> None:
    """``original_muon`` imported with ``deepspeed.runtime.compiler.compile`` lazy (the
    docstring); the decorator is DeepSpeed's own again afterwards."""
    if _MUON_KERNELS in sys.modules:
        return
    from deepspeed.runtime import compiler

    deepspeed_compile = compiler.compile

    def compile_on_first_call():
        def decorate(fn):
            compiled = None

            @functools.wraps(fn)
            def run(*args, **kwargs):
                nonlocal compiled
                if compiled is None:
                    compiled = deepspeed_compile()(fn)
                return compiled(*args, **kwargs)

            return run

        return decorate

    compiler.compile = compile_on_first_call
    try:
        importlib.import_module(_MUON_KERNELS)
    except ImportError:      # a DeepSpeed without Muon: nothing to put off
        pass
    finally:
        compiler.compile = deepspeed_compile


@contextmanager
def bf16_optimizer_unforced_memory_reports(memory_breakdown: bool = False) -> Iterator[None]:
    """Around ``deepspeed.initialize``: see the module docstring. ``memory_breakdown``: the
    engine's DeepSpeed config's (``True`` prints the reports as DeepSpeed would)."""
    from deepspeed.runtime import bf16_optimizer

    forced = bf16_optimizer.see_memory_usage

    def unforced(message, force=False):
        return forced(message, force=memory_breakdown)

    bf16_optimizer.see_memory_usage = unforced
    try:
        yield
    finally:
        bf16_optimizer.see_memory_usage = forced
