"""A machine's first run announces and times the build of DeepSpeed's CPU comm op; later runs
say nothing. The detection runs against DeepSpeed's real builder; the build itself (a minute
on 2 cores) is stood in for by a builder that writes the library where torch's JIT loader
would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vlp.platform.training.comm_op_build import (build_comm_op_once, cached_library,
                                                 comm_op_builder)
from vlp.platform.training.jit_ops_dir import use_extensions_dir


class RecordingBuilder:
    """DeepSpeed's builder's interface: its ``NAME`` and ``load()``, which here writes the
    library into ``TORCH_EXTENSIONS_DIR`` (as torch's ``cpp_extension.load`` does)."""
    NAME = "deepspeed_shm_comm"

    def __init__(self) -> None:
        self.loads = 0

    def load(self, verbose: bool = False):
        self.loads += 1
        lib = cached_library(os.environ["TORCH_EXTENSIONS_DIR"], self.NAME)
        lib.parent.mkdir(parents=True)
        lib.write_bytes(b"\x7fELF")


@pytest.fixture
def ext_env(monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "")     # restored after the test
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")


def test_cold_cache_is_announced_and_timed_once(tmp_path, ext_env):
    builder, said = RecordingBuilder(), []
    took = build_comm_op_once(str(tmp_path / "ext"), say=said.append, builder=builder)
    assert builder.loads == 1 and took is not None and took >= 0
    assert said[0].startswith("building DeepSpeed's CPU communication op once for this "
                              "machine")
    assert str(tmp_path / "ext") in said[0]
    assert said[1].startswith("… DeepSpeed's CPU communication op built in ")
    assert said[1].endswith(" s")

    again: list[str] = []
    assert build_comm_op_once(str(tmp_path / "ext"), say=again.append, builder=builder) == 0.0
    assert builder.loads == 1 and again == []


def test_real_builder_finds_a_warm_cache(tmp_path, ext_env):
    """DeepSpeed's own builder on this CPU machine: the op it would JIT-build is the one we
    look for, and a cache holding its library is warm (nothing is built or said)."""
    builder = comm_op_builder()
    assert builder is not None and builder.NAME == "deepspeed_shm_comm"
    warm = tmp_path / "warm"
    ext = Path(use_extensions_dir(str(warm)))
    lib = cached_library(ext, builder.NAME)
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    said: list[str] = []
    assert build_comm_op_once(str(warm), say=said.append) == 0.0 and said == []
