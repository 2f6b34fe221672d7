"""The one list of Meta-Sum parts and the views derived from it."""

import subprocess
import sys

from vlp.benchmarks import BENCHMARKS, get_benchmark, meta_sum
from vlp.platform.finetune.finetune_config import META_SUM_BENCHMARKS
from vlp.platform.sweep.sweep_config import DEFAULT_BENCHMARKS
from vlp.platform.tracking.leaderboard import PARTS as LEADERBOARD_PARTS


def test_each_part_names_a_registered_benchmark():
    # that the benchmark reports the part's metric key: test_finetune_oracle.evaluate
    for part in meta_sum.PARTS:
        assert part.benchmark in BENCHMARKS
        assert get_benchmark(part.benchmark).meta_parts[part.name] == part.metric


def test_views_follow_the_list():
    assert META_SUM_BENCHMARKS == ["vqa", "retrieval", "nlvr2", "refcoco+"]
    assert DEFAULT_BENCHMARKS == ["retrieval", "vqa", "nlvr2", "refcoco+"]    # sweep stages
    assert [k for k, _ in LEADERBOARD_PARTS] == ["vqa", "ir", "tr", "nlvr2", "refcoco_plus"]
    assert len({p.colour for p in meta_sum.PARTS}) == len(meta_sum.PARTS)
    assert meta_sum.complete({p: 1.0 for p in meta_sum.PART_NAMES})
    assert not meta_sum.complete({"vqa": 1.0})


def test_meta_sum_list_and_leaderboard_import_without_torch():
    code = ("import sys, vlp.benchmarks.meta_sum, vlp.platform.tracking.leaderboard_plot; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_registry_lists_benchmarks_alphabetically():
    assert list(BENCHMARKS) == sorted(BENCHMARKS)
