"""Every command in README.md runs as written, in the order written, from a fresh folder
holding only the repo's ``jobs/`` (as a fresh clone's working tree does).

The commands are read from the README's ```bash blocks, not copied here: a README edit that
breaks a command fails this test. Each is either run in this process through ``vlp.cli.main``
(attached to the session's Ray) with the size overrides of ``SIZED`` appended (stated there,
with why), or listed in ``NOT_RUN`` with the reason. A README command in neither fails the
test, so a new command cannot be skipped silently.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import pytest

REPO = Path(__file__).parents[1]
README = REPO / "README.md"

# command as written → why this test does not run it
NOT_RUN = {
    "make demo": "builds a venv and runs the whole demo sweep (about 9 minutes): "
                 "tests/test_demo*.py cover `vlp demo`, and the demo sweep's config runs "
                 "below, sized down",
    "make test": "is the suite this test belongs to",
    "vlp ui --run-dir runs/demo": "serves the MLflow UI until stopped: tests/test_ui*.py "
                                  "start it and screenshot it",
    "vlp doctor --config jobs/configs/uniter-base-indomain.yaml":
        "checks a Ray cluster's nodes: tests/test_multinode_cluster.py runs it on the local "
        "3-node cluster with S3 (its checks without Ray: tests/test_doctor_table.py)",
    "vlp data extract --images photos/ --model grid-r50 --weights resnet50.pth --source mine "
    "--out data/mine": "needs a user's photos/ and resnet50.pth weights, which a fresh clone "
                       "has not: tests/test_extract_e2e.py runs it on generated images",
}

# the sweeps' trials: a 4-step pretraining and one 4-step finetune stage (NLVR2), on the tiny
# world the tour made (the sweep configs name the world `make demo` writes, runs/demo/world)
_TINY_TRIALS = ["--world", "runs/worlds/tiny", "--set", "pretrain.train.steps=4",
                "--set", "pretrain.optimizer.warmup_steps=1",
                "--set", "pretrain.checkpoint.interval=4", "--set", "pretrain.train.log_every=2",
                "--set", "finetune.benchmarks=[nlvr2]",
                "--set", "finetune.overrides=[settings.nlvr2.steps=4]"]

# command as written → (arguments appended, exit status expected); commands not listed here
# or in NOT_RUN fail the test
SIZED = {
    "vlp data synth --scale tiny --out runs/worlds/tiny": ([], 0),
    # 60 steps → 4 (the last --set wins); the warm-up and checkpoint sized to fit; one Ray
    # Train worker, not the config's two (two-worker runs: test_pretrain_train.py and others)
    "vlp pretrain --config jobs/configs/pretrain-tiny.yaml --set train.steps=60":
        (["--set", "train.steps=4", "--set", "optimizer.warmup_steps=1",
          "--set", "checkpoint.interval=4", "--set", "scaling.num_workers=1"], 0),
    # a cluster config off the cluster: the config judged valid, its inputs listed (exit 3)
    "vlp pretrain --config jobs/configs/uniter-base-indomain.yaml --check": ([], 3),
    "vlp pretrain --config jobs/configs/pretrain-tiny.yaml --local --steps 4": ([], 0),
    "vlp steps runs/pretrain-tiny --plot loss.png": ([], 0),
    # one benchmark of four, 4 steps
    "vlp finetune --checkpoint runs/pretrain-tiny --world runs/worlds/tiny":
        (["--benchmarks", "nlvr2", "--set", "settings.nlvr2.steps=4"], 0),
    "vlp evaluate --checkpoint runs/pretrain-tiny --world runs/worlds/tiny": ([], 0),
    # 1 trial (the no-pretraining point) instead of 3 + a replicate: the search, its Ray
    # Tune + Optuna set-up and the leaderboard run all the same; pretraining ran above
    "vlp sweep --config jobs/configs/sweep-demo.yaml":
        (_TINY_TRIALS + ["--set", "sweep.num_samples=1", "--set", "sweep.include=[none]",
                         "--set", "sweep.include_seeds={}", "--set", "sweep.max_concurrent=1"],
         0),
    # 1 of Table 3's 13 lines: every other line starts from text-only MLM weights that the
    # sweep first trains on the world's captions (600 steps), the cost of a line of its own
    "vlp sweep --config jobs/configs/table3-demo.yaml":
        (_TINY_TRIALS + ["--set", "sweep.lines=[L01]", "--set", "sweep.max_concurrent=1"], 0),
    "vlp leaderboard --run-dir runs/demo": ([], 0),
}


def readme_commands(text: str) -> list[str]:
    """The commands of the README's ```bash blocks, in order, without trailing comments."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                out.append(" ".join(command.split()))
    return out


def test_every_readme_command_is_run_or_says_why_not():
    commands = readme_commands(README.read_text())
    unknown = [c for c in commands if c not in SIZED and c not in NOT_RUN]
    assert not unknown, (f"README.md commands this test neither runs nor lists in NOT_RUN "
                         f"(add each to SIZED with its size overrides, or to NOT_RUN with "
                         f"why): {unknown}")
    stale = [c for c in list(SIZED) + list(NOT_RUN) if c not in commands]
    assert not stale, f"listed here but no longer in README.md: {stale}"


@pytest.mark.timeout(900)     # ~2 min on a quiet 2-core machine; 10+ when loaded
def test_the_readme_tour_runs_in_order(ray_local, tmp_path, monkeypatch, capsys):
    from vlp.cli import main
    from vlp.platform.cluster import console

    (tmp_path / "jobs").symlink_to(REPO / "jobs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("VLP_STORAGE", raising=False)
    ran = []
    try:
        for command in readme_commands(README.read_text()):
            if command in NOT_RUN:
                continue
            extra, expected = SIZED[command]
            t0 = time.perf_counter()
            status = main(shlex.split(command)[1:] + extra)
            out, err = capsys.readouterr()
            with capsys.disabled():     # what each command cost, for whoever sizes the tour
                print(f"\n[tour] {time.perf_counter() - t0:6.1f} s  {command}", flush=True)
            assert status == expected, (f"`{command}` (+ {extra}) exited {status}, expected "
                                        f"{expected}:\n{out[-3000:]}\n{err[-3000:]}")
            ran.append((command, out))
    finally:
        console.configure(quiet=False)
    said = dict(ran)
    check = said["vlp pretrain --config jobs/configs/uniter-base-indomain.yaml --check"]
    assert "is valid" in check and "model.init_path" in check and "--set" in check
    # --local kept to a run of its own: the Ray run the finetune reads is untouched
    assert (tmp_path / "runs" / "pretrain-tiny-local").is_dir()
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert "Meta-Sum" in said["vlp leaderboard --run-dir runs/demo"]
