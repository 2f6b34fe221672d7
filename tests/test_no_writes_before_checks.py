"""A command whose input fails a check writes nothing: no run folder, no log file, no half
of a data folder. Each case runs the command in-process in an empty working folder (its
inputs set up there first) and compares the folder's tree before and after; none starts Ray.

The unreachable tracking server is 127.0.0.1:9 (discard: nothing listens there), so its check
fails at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlp.cli import main

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "jobs" / "configs"
NOBODY = "http://127.0.0.1:9"
SOURCES = ("coco", "vg", "cc", "sbu")


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("VLP_STORAGE", raising=False)
    return tmp_path


def bad_world(root: Path) -> Path:
    (root / "W").mkdir()
    (root / "W" / "manifest.json").write_text("not json")
    return root / "W"


def run_unchanged(root: Path, argv: list[str], capsys) -> str:
    """Run ``vlp argv``: it must fail, and leave ``root``'s tree as it was; its output."""
    before = tree(root)
    status = main(argv)
    out = capsys.readouterr()
    assert status != 0, out
    assert tree(root) == before, f"written before the checks passed: {tree(root) - before}"
    return out.out + out.err


def test_finetune_bad_manifest_names_no_log(cwd, capsys):
    bad_world(cwd)
    text = run_unchanged(cwd, ["finetune", "--checkpoint", "none", "--world", "W",
                               "--benchmarks", "vqa"], capsys)
    assert "manifest.json: not valid JSON" in text
    assert "ray-output.log" not in text        # the log is named once the checks pass


def test_finetune_unreachable_tracking(cwd, capsys, tiny_world):
    text = run_unchanged(cwd, ["finetune", "--checkpoint", "none", "--world", str(tiny_world),
                               "--benchmarks", "vqa", "--tracking-uri", NOBODY], capsys)
    assert "unreachable" in text


def test_finetune_job_script_unreachable_tracking(cwd, capsys, tiny_world):
    import importlib.util

    spec = importlib.util.spec_from_file_location("finetune_job", REPO / "jobs" / "finetune.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    before = tree(cwd)
    assert job.main(["--checkpoint", "none", "--world", str(tiny_world), "--benchmarks", "vqa",
                     "--tracking-uri", NOBODY]) == 1
    assert tree(cwd) == before
    assert "unreachable" in capsys.readouterr().err


def test_evaluate_bad_manifest(cwd, capsys):
    w = bad_world(cwd)
    run_unchanged(cwd, ["evaluate", "--checkpoint", str(w), "--world", "W"], capsys)


def sources_at(world: Path) -> list[str]:
    return [a for s in SOURCES for a in ("--set", f"data.sources.{s}.path={world}/images/{s}")]


def test_pretrain_unreachable_tracking(cwd, capsys, tiny_world):
    text = run_unchanged(cwd, ["pretrain", "--config", str(CONFIGS / "pretrain-tiny.yaml"),
                               "--tracking-uri", NOBODY, *sources_at(tiny_world)], capsys)
    assert "unreachable" in text and "ray-output.log" not in text


def test_pretrain_missing_data(cwd, capsys):
    run_unchanged(cwd, ["pretrain", "--config", str(CONFIGS / "pretrain-tiny.yaml")], capsys)


def test_sweep_bad_world(cwd, capsys):
    bad_world(cwd)
    run_unchanged(cwd, ["sweep", "--config", str(CONFIGS / "sweep-tiny.yaml"),
                        "--set", "world=W"], capsys)


def test_demo_bad_option_writes_no_world(cwd, capsys):
    text = run_unchanged(cwd, ["demo", "--scale", "tiny", "--set", "sweep.bogus=1"], capsys)
    assert "sweep.bogus" in text


def test_demo_zero_trials_is_refused(cwd, capsys):
    text = run_unchanged(cwd, ["demo", "--scale", "tiny", "--trials", "0"], capsys)
    assert "sweep.num_samples" in text


@pytest.mark.parametrize("command", ["leaderboard", "ui"])
def test_store_commands_without_store(cwd, capsys, command):
    run_unchanged(cwd, [command, "--run-dir", "nope"], capsys)


def test_synth_bad_seed(cwd, capsys):
    run_unchanged(cwd, ["data", "synth", "--out", "X", "--scale", "tiny", "--seed", "-1",
                        "--no-progress"], capsys)


@pytest.mark.parametrize("fmt,files,extra", [
    ("butd-tsv", {"bad.tsv": "garbage\n"}, ["--source", "coco"]),
    ("karpathy", {"bad.json": "{"}, []),
    ("vqa", {"q.json": "{", "a.json": "{"}, []),
])
def test_import_bad_file_leaves_no_folder(cwd, capsys, fmt, files, extra):
    for name, text in files.items():
        (cwd / name).write_text(text)
    run_unchanged(cwd, ["data", "import", fmt, *files, "--out", "OUT/data", *extra], capsys)


def test_validate_missing_file(cwd, capsys):
    run_unchanged(cwd, ["data", "validate", "nope.parquet"], capsys)


@pytest.mark.parametrize("extra", [[], ["--exclude-leaks", "--out", "OUT"]])
def test_audit_bad_manifest(cwd, capsys, extra):
    bad_world(cwd)
    run_unchanged(cwd, ["data", "audit", "W", *extra], capsys)


def test_curate_unknown_source(cwd, capsys, tiny_world):
    run_unchanged(cwd, ["data", "curate", str(tiny_world), "--source", "zz", "--out", "OUT"],
                  capsys)
