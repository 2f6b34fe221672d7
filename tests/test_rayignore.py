"""`ray job submit --working-dir .` packs the repository with Ray's own packer, which reads
.rayignore: data, runs, checkpoints, worlds, the virtualenv and .git never upload, the code
does (vlp/models/checkpoints/ included). Checked with ``create_package``, the function the
job submission client calls, with and without Ray also reading .gitignore."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
NEVER = (".git", ".venv", "runs", "data", "checkpoints", "worlds", "mlruns")
KEPT = ("vlp/models/checkpoints/__init__.py", "jobs/pretrain.py", "tests/data/fixture.txt",
        "jobs/configs/uniter-large.yaml")


def packed(folder: Path, out: Path, include_gitignore: bool) -> set[str]:
    from ray._private.runtime_env.packaging import create_package

    create_package(str(folder), out, include_gitignore=include_gitignore)
    with zipfile.ZipFile(out) as z:
        return set(z.namelist())


@pytest.fixture
def tree(tmp_path):
    """A working dir laid out like this repository's, with the big folders filled."""
    root = tmp_path / "repo"
    for rel in KEPT + (".git/HEAD", ".git/objects/pack/p.pack", ".venv/bin/python",
                       "runs/pretrain/checkpoint_step00000010/mp_rank_00_model_states.pt",
                       "data/real/images/coco/shard-00000.parquet", "checkpoints/bert-large.pt",
                       "worlds/demo/manifest.json", "mlruns/0/meta.yaml",
                       "vlp/__pycache__/cli.cpython-311.pyc"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    shutil.copy(ROOT / ".rayignore", root / ".rayignore")
    return root


@pytest.mark.parametrize("include_gitignore", [False, True])
def test_big_folders_and_git_never_upload(tree, tmp_path, include_gitignore):
    shutil.copy(ROOT / ".gitignore", tree / ".gitignore")
    names = packed(tree, tmp_path / "pkg.zip", include_gitignore)
    leaked = sorted(n for n in names if n.split("/")[0] in NEVER or "__pycache__" in n)
    assert leaked == []
    assert set(KEPT) <= names


def test_this_repository_packs_without_them(tmp_path):
    names = packed(ROOT, tmp_path / "pkg.zip", include_gitignore=False)
    assert not [n for n in names if n.split("/")[0] in NEVER]
    assert "vlp/models/checkpoints/uniter_release.py" in names and "jobs/pretrain.py" in names
