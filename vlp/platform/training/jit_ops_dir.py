"""Where DeepSpeed's JIT-built ops are cached (``TORCH_EXTENSIONS_DIR``), one folder per ninja.

vlp's default configs build none (DeepSpeed's CPU comm op is left out: ``deepspeed_import.py``);
``optimizer.impl: deepspeed-fused`` JIT-builds DeepSpeed's FusedAdam on each new node. Without
torch or DeepSpeed imports, so that asking costs nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

DEFAULT_EXTENSIONS_DIR = "~/.cache/torch_extensions/vlp"


def extensions_dir(configured: str = "") -> str:
    """Where DeepSpeed's JIT ops are built and cached (a C++ op: tens of seconds to build cold
    on a 2-core CPU, a fraction of a second cached)."""
    path = configured or os.environ.get("TORCH_EXTENSIONS_DIR") or DEFAULT_EXTENSIONS_DIR
    return str(Path(path).expanduser().resolve())


def ninja_tag() -> str:
    """``ninja-<version>`` of the ``ninja`` on this process's PATH, the one torch builds with.
    Two ninja versions read each other's build log as changed and rebuild everything, so a
    driver and workers with different PATHs (a venv's ninja against the system's) would
    rebuild DeepSpeed's ops from scratch at every switch: each version gets its own folder."""
    exe = shutil.which("ninja")
    if exe is None:
        return "ninja-none"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "ninja-unknown"
    version = out.stdout.strip().split("\n")[0] if out.returncode == 0 else ""
    return "ninja-" + ("".join(c for c in version if c.isalnum() or c in ".-_") or "unknown")


def ninja_extensions_dir(configured: str = "") -> str:
    """The configured folder's subfolder for this process's ninja (the folder itself when it
    is that subfolder already): where this process's ops are built and loaded."""
    path, tag = Path(extensions_dir(configured)), ninja_tag()
    return str(path if path.name == tag else path / tag)


def use_extensions_dir(configured: str = "") -> str:
    """Sets ``TORCH_EXTENSIONS_DIR`` to ``ninja_extensions_dir(configured)``, made."""
    path = Path(ninja_extensions_dir(configured))
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(path)
    return str(path)


__all__ = ["DEFAULT_EXTENSIONS_DIR", "extensions_dir", "ninja_extensions_dir", "ninja_tag",
           "use_extensions_dir"]
