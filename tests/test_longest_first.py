"""`make test`'s scheduling (tests/longest_first.py, wired in tests/conftest.py), run for real:
pytest-xdist with two workers over a generated suite of four files, each with two tests of
its own and two marked ``xdist_group("g2")``. This repo's conftest.py is the suite's, so the
hooks under test are the ones `make test` uses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from longest_first import scope_of as scope

HERE = Path(__file__).parent

TEST_FILE = '''
import os, pytest

def _log():
    with open(os.environ["ORDER_LOG"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + " " +
                os.environ["PYTEST_CURRENT_TEST"].split(" ")[0] + "\\n")

def test_1(): _log()

@pytest.mark.xdist_group("g2")
def test_2(): _log()

@pytest.mark.xdist_group("g2")
def test_3(): _log()

def test_4(): _log()
'''


def test_scopes_go_out_longest_first_whole_and_their_seconds_are_kept(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("conftest.py", "longest_first.py"):
        shutil.copy(HERE / name, tests / name)
    for f in "abcd":
        (tests / f"test_{f}.py").write_text(TEST_FILE)
    # the last run's seconds: b's group part and file c the longest, the rest unknown
    cache = tmp_path / ".pytest_cache" / "v" / "vlp"
    cache.mkdir(parents=True)
    (cache / "scope_seconds").write_text(json.dumps({"tests/test_b.py@g2": 100,
                                                     "tests/test_c.py": 50}))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "order.log"
    done = subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-n", "2",
                           "--dist", "loadgroup"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items()
                                  if not k.startswith("PYTEST_")}, "ORDER_LOG": str(log)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    runs = [line.split() for line in log.read_text().splitlines()]
    assert len(runs) == 16
    by_worker: dict[str, list[str]] = {}
    for worker, nodeid in runs:
        by_worker.setdefault(worker, []).append(nodeid)

    # the grouped tests carry their group in their ids, and each scope ran on one worker
    assert {n for _, n in runs if n.endswith("@g2")} == {
        f"tests/test_{f}.py::test_{i}@g2" for f in "abcd" for i in (2, 3)}
    workers_of: dict[str, set[str]] = {}
    for worker, nodeid in runs:
        workers_of.setdefault(scope(nodeid), set()).add(worker)
    assert len(workers_of) == 8 and all(len(w) == 1 for w in workers_of.values())
    # the two longest scopes went out first, one to each worker
    assert {scope(ids[0]) for ids in by_worker.values()} == {"tests/test_b.py@g2",
                                                            "tests/test_c.py"}
    # a scope's tests ran together: never another scope's test between two of its own
    for ids in by_worker.values():
        scopes = [scope(n) for n in ids]
        assert [s for i, s in enumerate(scopes) if i == 0 or s != scopes[i - 1]] == list(
            dict.fromkeys(scopes)), ids

    assert "worker seconds per scope (longest first)" in done.stdout
    saved = json.loads((cache / "scope_seconds").read_text())
    assert set(saved) == set(workers_of)        # every scope's measured seconds, kept

