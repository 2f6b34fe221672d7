"""How `make test` hands test files to its pytest-xdist workers: longest first, one at a time.

A *scope* is what one worker runs start to end, so that its module fixtures (a 3-node
cluster, a tracking server) start once: a test file, or, for tests marked
``@pytest.mark.xdist_group("name")``, the part ``file@name`` (with ``--dist loadgroup``
xdist appends ``@name`` to those tests' ids). Marking splits a long file whose tests form
independent sets over their own fixtures: each part starts its own copies, on another worker
at the same time.

Scopes go out longest first (the longest-processing-time rule): the suite ends when its
longest chain of work ends, and a 10-minute file started last ends 10 minutes after
everything else. Each scope's seconds come from the last run's measurement (the pytest cache,
``vlp/scope_seconds``, written at the end of every xdist run) or, on a fresh clone, from
``SECONDS`` below; scopes known to neither run after, in collection order.

A worker gets its next scope only when it holds one unrun test of its current one, the least
xdist's worker protocol allows (a worker starts a test once it knows the next, or that there
is none). xdist's own scheduler refills at two or fewer, which queued a short file behind a
long last test of another, and sorts scopes by their number of tests.
"""

from __future__ import annotations

from collections import OrderedDict

from xdist.scheduler.loadscope import LoadScopeScheduling

CACHE_KEY = "vlp/scope_seconds"

# Worker seconds per scope (setup + call + teardown of its tests) on a quiet 2-core machine,
# from `make test`'s two-worker longest-first run (1,075 passed in 16:15, 1,906 worker seconds
# in all; pytest's cache, vlp/scope_seconds), the tracking file's two parts since merged. Only
# scopes over ~40 s matter for the order; the cache replaces these after each run.
SECONDS = {
    "tests/test_multinode_cluster.py": 457,
    "tests/test_tracking_cluster.py": 147,
    "tests/test_pretrain_train.py": 137,
    "tests/test_readme_tour.py": 109,
    "tests/test_compile_static.py": 116,
    "tests/test_extract_cluster.py": 87,
    "tests/test_gpu_placement.py": 68,
    "tests/test_gpu_check.py": 56,
    "tests/test_sweep_asha.py": 46,
    "tests/test_batch_process.py": 42,
    "tests/test_finetune_ray.py": 41,
    "tests/test_pipeline_ray.py": 40,
    "tests/test_trimmed_ray.py": 39,
    "tests/test_sweep_worker_group.py": 38,
    "tests/test_pretrain_resume_world_ray.py": 37,
    "tests/test_extract_e2e.py": 37,
    "tests/test_platform_train.py": 34,
    "tests/test_pretrain_fail_once.py": 21,
    "tests/test_ray_session.py": 20,
    "tests/test_deepspeed_import.py": 19,
    "tests/test_extract_job.py": 18,
    "tests/test_models_reference_curves.py": 18,
}


def scope_of(nodeid: str) -> str:
    """``file`` or ``file@group``: the test's id up to its first ``::``, plus the group
    xdist appended to it."""
    file = nodeid.split("::", 1)[0]
    group = nodeid.rsplit("@", 1)[1] if "@" in nodeid.split("::", 1)[-1] else ""
    return f"{file}@{group}" if group else file


def add_group_suffixes(items) -> None:
    """``@name`` appended to the id of each test marked ``xdist_group("name")`` that has no
    suffix yet. Where this pytest keeps ids elsewhere the id stays as it is, and the test
    runs with the rest of its file: slower, never wrong."""
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if not names or "@" in item.nodeid.split("::", 1)[-1]:
            continue
        wanted = f"{item.nodeid}@{'_'.join(names)}"
        try:
            from _pytest.nodeid import coerce_node_id     # pytest 9: ids are NodeId objects

            item._id = coerce_node_id(wanted)
        except ImportError:
            item._nodeid = wanted                        # pytest 8
        if item.nodeid != wanted:
            raise RuntimeError(f"cannot give {item.nodeid} its xdist group")


class LongestFirst(LoadScopeScheduling):
    def __init__(self, config, log=None, seconds: dict[str, float] | None = None):
        super().__init__(config, log)
        self.seconds = {**SECONDS, **(seconds or {})}

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 1:
            return
        self._assign_work_unit(node)

    def schedule(self) -> None:
        """xdist's LoadScopeScheduling.schedule with the queue in our order and one scope
        per worker to start with."""
        assert self.collection_is_completed
        if self.collection is not None:         # a node added later: feed it as usual
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        units: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        ranked = sorted(enumerate(units.items()),
                        key=lambda e: (-self.seconds.get(e[1][0], 0.0), e[0]))
        self.workqueue = OrderedDict(unit for _, unit in ranked)
        for _ in range(len(self.nodes) - len(self.workqueue)):     # more workers than work
            unused, _ = self.assigned_work.popitem()
            unused.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:                  # a one-test scope: its next one now
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()


class ScopeClock:
    """The controller's record of each scope's worker seconds (its tests' setup, call and
    teardown durations as the workers report them), saved in the pytest cache for the next
    run's order and the longest printed at the end."""

    def __init__(self, config):
        self.config = config
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report) -> None:
        scope = scope_of(report.nodeid)
        self.seconds[scope] = self.seconds.get(scope, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        ranked = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        terminalreporter.write_sep("=", "worker seconds per scope (longest first)")
        for scope, s in ranked[:25]:
            terminalreporter.write_line(f"{s:8.1f}s {scope}")
        terminalreporter.write_line(f"{sum(self.seconds.values()):8.1f}s in all, "
                                    f"{len(self.seconds)} scopes")
        cache = getattr(self.config, "cache", None)
        if cache is not None:
            saved = cache.get(CACHE_KEY, {})
            saved.update({k: round(v, 1) for k, v in self.seconds.items()})
            cache.set(CACHE_KEY, saved)


def saved_seconds(config) -> dict[str, float]:
    cache = getattr(config, "cache", None)
    return dict(cache.get(CACHE_KEY, {})) if cache is not None else {}
