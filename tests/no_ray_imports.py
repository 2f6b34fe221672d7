"""A Python prelude that refuses imports of Ray, MLflow and Optuna: the GPU machine and the
local runner have none of them, so the tests run those paths in a process that starts with
it (``python -c PRELUDE + code``)."""

from __future__ import annotations

import textwrap

PRELUDE = textwrap.dedent("""
    import builtins
    _real_import = builtins.__import__
    def _guarded(name, *a, **k):
        if name.split(".")[0] in ("ray", "mlflow", "optuna"):
            raise ImportError(f"imported {name} on a path that must run without it")
        return _real_import(name, *a, **k)
    builtins.__import__ = _guarded
""")
