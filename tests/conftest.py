"""Shared fixtures: one local Ray instance per test session (starting Ray costs seconds)."""

from __future__ import annotations

import os
import sys

import pytest

# DeepSpeed's JIT-built ops in one cache (vlp's configs build none: deepspeed_import.py leaves
# out the CPU comm op; `optimizer.impl: deepspeed-fused` builds FusedAdam)...
os.environ.setdefault("TORCH_EXTENSIONS_DIR",
                      os.path.expanduser("~/.cache/torch_extensions/vlp"))
# ...with one ninja: the venv's bin first on PATH for this process and all it starts (the
# xdist workers import this file too), as in an activated venv and on the `ray start`
# clusters' nodes; two ninja versions read each other's build log as changed and rebuild.
_VENV_BIN = os.path.dirname(sys.executable)     # not resolved: a venv's python is a link
if os.environ.get("PATH", "").split(os.pathsep)[0] != _VENV_BIN:
    os.environ["PATH"] = f"{_VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray Train's controller polls its workers every 2 s by default: a worker group's start, each
# checkpoint report (vlp waits for it, see vlp/platform/training/reporter.py) and the end of
# a run each wait for the next poll, seconds per fit that the tests' tiny fits are mostly made
# of. Set here, before any Ray starts, it reaches every Train controller the tests start: Ray
# Train passes it from the driver to its controller, and the clusters that test files start
# with `ray start` get this process's environment. The poll only reads the workers' status;
# a slow answer is waited for as before (a worker counts as dead after 10 minutes unanswered).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
# Ray's background work on every node the tests start, for the whole session (an idle
# session Ray takes ~7% of a core): the log monitor lists its node's log folder every 0.5 s
# (Ray's own pace past 1,000 files) instead of on every 0.1 s pass, which costs more as the
# session's worker logs pile up; the dashboard agent samples every process's stats for the
# dashboard's graphs, which no test reads, once a minute instead of every 5 s.
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "60000")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s workers get scopes longest first, one at a time (tests/longest_first.py);
    a file's tests marked ``xdist_group`` form a scope of their own under --dist loadgroup."""
    if config.getoption("dist") not in ("loadfile", "loadgroup"):
        return None
    from longest_first import LongestFirst, saved_seconds

    return LongestFirst(config, log, saved_seconds(config))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    # --dist loadgroup on a worker: xdist 3.8 appends "@group" to an xdist_group test's id
    # through an attribute pytest 9 no longer reads; done here where it did not happen
    if getattr(config.option, "loadgroup", False):
        from longest_first import add_group_suffixes

        add_group_suffixes(items)


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        return
    # on the xdist controller only: each scope's worker seconds, printed and cached
    if getattr(config.option, "dist", "no") != "no":
        from longest_first import ScopeClock

        config.pluginmanager.register(ScopeClock(config), "vlp-scope-clock")


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray with a logically larger CPU count (2-core machines deadlock Ray Data's
    list-files task next to Train workers otherwise; see RAY_GUIDE.md). The dashboard is on:
    Tune's placement-group cleaner needs the State API it serves."""
    import ray

    if not ray.is_initialized():
        # address="local": a new instance, never whatever a stale /tmp/ray file names
        ray.init(address="local", num_cpus=4, include_dashboard=True, dashboard_host="127.0.0.1",
                 log_to_driver=False,
                 configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's standalone S3 server on 127.0.0.1 at a free port (``cluster_helpers.S3Server``),
    started once per session (seconds): each test module keeps to buckets of its own."""
    from cluster_helpers import S3Server

    server = S3Server(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path):
    """This process's environment as a cluster node's: ``s3_server``'s endpoint and keys in
    the standard AWS variables (as users set them), and a weights cache of the test's own."""
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "cache"))
    return s3_server


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """The tiny synthetic world (seed 0), generated once per test session (~1 s).

    Read-only by convention: tests that change files must copy it first."""
    from vlp.datasets.synth import generate_world

    return generate_world(tmp_path_factory.mktemp("worlds") / "tiny", scale="tiny", seed=0)


@pytest.fixture
def one_rank():
    """A gloo process group of one rank in this process, for the test's length. An in-process
    local run (``local_runner.one_process_group``) keeps its one-rank group for the life of
    the process by design; a test after it on the same xdist worker uses that group as is."""
    import torch.distributed as dist

    if dist.is_initialized():
        assert dist.get_world_size() == 1 and dist.get_backend() == "gloo", (
            f"a process group of {dist.get_world_size()} ranks ({dist.get_backend()}) was left "
            f"up in this test process")
        yield
        return
    from vlp.platform.training.rendezvous import join_group, open_store

    store = open_store()        # held for the group's life (rendezvous.py says why)
    join_group("gloo", "127.0.0.1", store.port, 0, 1)
    yield
    dist.destroy_process_group()
    del store
