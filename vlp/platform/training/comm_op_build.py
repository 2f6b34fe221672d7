"""DeepSpeed's CPU communication op, built where the user can see it.

On the CPU accelerator ``deepspeed.initialize`` JIT-compiles its shared-memory comm op
(``deepspeed_shm_comm``) the first time a machine runs it, and caches it under
``TORCH_EXTENSIONS_DIR``; inside ``initialize`` that is a silent pause of a minute or more on
a small machine. A worker calls ``build_comm_op_once`` before its engine starts: a cold
cache is announced, built, and timed in the run's own lines; a warm one says nothing (the
engine loads it in a fraction of a second). On a GPU (no such op) it does nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from vlp.platform.training.deepspeed_import import load_deepspeed
from vlp.platform.training.jit_ops_dir import use_extensions_dir

OP_BUILDER = "ShareMemCommBuilder"


def comm_op_builder() -> Any | None:
    """DeepSpeed's builder of the op that ``deepspeed.initialize`` will load here, or None:
    another accelerator (CUDA has none), an op this machine cannot build (DeepSpeed then
    skips it too), or one installed prebuilt with DeepSpeed."""
    load_deepspeed()   # before any deepspeed import: deepspeed_import.py
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops

    builder = get_accelerator().create_op_builder(OP_BUILDER)
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return None
    if installed_ops.get(builder.NAME, False):
        return None
    return builder


def cached_library(extensions_dir: str | Path, name: str) -> Path:
    """Where torch's JIT loader keeps op ``name``'s library (``<dir>/<name>/<name>.so``)."""
    return Path(extensions_dir) / name / f"{name}.so"


def build_comm_op_once(configured: str = "", *, say: Callable[[str], None] = print,
                       builder: Any | None = None) -> float | None:
    """Build the op now if this machine's cache lacks it, saying so before and after; the
    build's seconds, 0.0 when it was cached, None when there is nothing to build."""
    ext = use_extensions_dir(configured)
    builder = builder if builder is not None else comm_op_builder()
    if builder is None:
        return None
    if cached_library(ext, builder.NAME).is_file():
        return 0.0
    say(f"building DeepSpeed's CPU communication op once for this machine (cached in {ext}; "
        f"the next runs load it) …")
    start = time.perf_counter()
    builder.load(verbose=False)
    took = time.perf_counter() - start
    say(f"… DeepSpeed's CPU communication op built in {took:.0f} s")
    return took
