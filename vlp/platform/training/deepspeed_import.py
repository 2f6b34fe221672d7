"""``import deepspeed`` without the MLflow import its autotuner makes on the side, and its engine
without the Muon optimizer its ZeRO check imports.

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

``zero_check_without_muon()`` is the same for DeepSpeed 0.19's ZeRO check: on every
``deepspeed.initialize`` under ZeRO, ``is_zero_supported_optimizer`` imports its Muon optimizer
to add it to the supported list, and that module compiles a function with ``torch.compile`` as
it is imported, which imports dynamo and inductor: ~1.9 s of CPU in every process that builds
a ZeRO engine (each Ray Train worker of every run and stage, each rank of a local run). vlp's
optimizer is AdamW (``engine.deepspeed_config``) or SOHO's SGD + AdamW, never Muon; while
``build_engine`` initializes, that import from the ZeRO check alone fails (the check's own
``except ImportError`` then leaves Muon off the list, as on a DeepSpeed without it). Imported
anywhere else, or already imported, Muon is there as usual.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

_AUTOTUNER = "deepspeed.autotuning.autotuner"
_MUON = "deepspeed.runtime.zero.muon.muon_optimizer"
_ZERO_UTILS = "deepspeed.runtime.zero.utils"


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
    found = sys.modules.get("deepspeed")
    if found is not None:
        return found
    finder = _NoMlflowForTheAutotuner()
    sys.meta_path.insert(0, finder)
    try:
        import deepspeed
    finally:
        sys.meta_path.remove(finder)
    return deepspeed


class _NoMuonForTheZeroCheck(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _MUON:
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if (frame.f_globals.get("__name__") == _ZERO_UTILS
                    and frame.f_code.co_name == "is_zero_supported_optimizer"):
                raise ImportError("DeepSpeed's Muon optimizer is not imported for the ZeRO "
                                  "check of vlp's AdamW (vlp.platform.training.deepspeed_import)")
            frame = frame.f_back
        return None


@contextmanager
def zero_check_without_muon() -> Iterator[None]:
    """Around ``deepspeed.initialize``: see the module docstring."""
    finder = _NoMuonForTheZeroCheck()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
