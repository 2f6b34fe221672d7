"""DeepSpeed's JIT ops are cached per ninja version: a driver and workers whose PATHs hold
different ninjas must not rebuild each other's ops (each reads the other's build log as
changed)."""

from __future__ import annotations

import os
import stat

from vlp.platform.training.jit_ops_dir import use_extensions_dir


def fake_ninja(folder, version: str) -> str:
    folder.mkdir()
    exe = folder / "ninja"
    exe.write_text(f"#!/bin/sh\necho {version}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(folder)


def test_each_ninja_version_builds_in_its_own_folder(tmp_path, monkeypatch):
    old, new = fake_ninja(tmp_path / "a", "1.11.1"), fake_ninja(tmp_path / "b", "1.13.0")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    base = tmp_path / "ext"

    monkeypatch.setenv("PATH", old)
    first = use_extensions_dir(str(base))
    assert first == str(base / "ninja-1.11.1") and os.environ["TORCH_EXTENSIONS_DIR"] == first
    assert use_extensions_dir(str(base)) == first            # the same process again
    assert use_extensions_dir("") == first                   # from the variable it set

    monkeypatch.setenv("PATH", new)
    assert use_extensions_dir(str(base)) == str(base / "ninja-1.13.0")

    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert use_extensions_dir(str(base)) == str(base / "ninja-none")
