"""Meta-Sum's parts pinned by a table written by hand from UNITER's Table 3 (not read back
from ``meta_sum.PARTS``): which benchmark scores each part, under which metric key, how that
metric is computed, and the key the trial run logs it under for the leaderboard. Each row is
checked against a real evaluation of the tiny world (random scores through the benchmark's
own ``evaluate``), the finetune's part extraction, the sweep trial's report (the metrics the
leaderboard reads, Meta-Sum their sum) and the leaderboard's columns.

The per-finetune MLflow logging (``downstream.<part>`` on the parent run, from a real Ray
Train finetune) is checked in ``test_finetune_ray.py`` against ``TABLE`` too."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from vlp.benchmarks import BenchmarkContext, get_benchmark, meta_sum
from vlp.benchmarks.eval_runner import EvalRunner
from vlp.benchmarks.refcoco_plus import refexp_accuracy
from vlp.benchmarks.vqa import vqa_score
from vlp.contract import batch_spec as K
from vlp.contract import downstream_keys as D
from vlp.datasets.downstream import data_config_for
from vlp.models import create_model

torch.set_num_threads(1)


def mean_of(*keys):
    return lambda m, preds, data: float(np.mean([m[k] for k in keys]))


def vqa_accuracy_of_predictions(m, preds, data):
    raw = pq.read_table(data.path).to_pydict()["answers"]
    return vqa_score([p["answer"] for p in preds], raw)


def accuracy_of_labels(m, preds, data):
    return 100.0 * float(np.mean([p["label"] == bool(y) for p, y in zip(preds, data.labels)]))


def accuracy_on_detected_boxes(m, preds, data):
    assert data.setting == "detected"              # UNITER's val^d, not ground-truth boxes
    return refexp_accuracy([p["box"] for p in preds], data.target_boxes)


# part | benchmark | metric key | how it is computed | trial/leaderboard key | column
TABLE = [
    ("vqa", "vqa", "vqa_score", vqa_accuracy_of_predictions, "vqa", "VQA"),
    ("ir", "retrieval", "ir_mean", mean_of("ir_r1", "ir_r5", "ir_r10"), "ir", "IR"),
    ("tr", "retrieval", "tr_mean", mean_of("tr_r1", "tr_r5", "tr_r10"), "tr", "TR"),
    ("nlvr2", "nlvr2", "nlvr2_acc", accuracy_of_labels, "nlvr2", "NLVR2"),
    ("refcoco+", "refcoco+", "refcocoplus_acc", accuracy_on_detected_boxes, "refcoco_plus",
     "RefCOCO+"),
]


def test_parts_are_the_tables():
    assert [(p.name, p.benchmark, p.metric, p.key, p.label) for p in meta_sum.PARTS] == \
        [(name, bench, metric, key, label) for name, bench, metric, _, key, label in TABLE]
    for name, bench, metric, *_ in TABLE:
        assert get_benchmark(bench).meta_parts[name] == metric
    assert get_benchmark("refcoco+").boxes == "detected"


class RandomScores(nn.Module):
    """Scores in the shape each benchmark's head predicts, from a seeded generator (no ties):
    ``widths`` maps a batch to its output shape."""

    def __init__(self, shape):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.shape, self.rng = shape, np.random.default_rng(0)

    def predict(self, batch):
        return torch.as_tensor(self.rng.normal(size=self.shape(batch)), dtype=torch.float32)


SHAPES = {
    "vqa": lambda data: lambda b: (len(b[D.EXAMPLE_INDEX]), len(data.vocab.answers)),
    "retrieval": lambda data: lambda b: (len(b[K.INPUT_IDS]),),
    "nlvr2": lambda data: lambda b: (len(b[D.LABELS]), 2),
    "refcoco+": lambda data: lambda b: tuple(b[K.REGION_MASK].shape),
}


@pytest.fixture(scope="module")
def evaluated(tiny_world):
    """benchmark → (metrics, predictions, data) of a random-score evaluation."""
    base, spec, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64)
    data_cfg = data_config_for(spec, str(tiny_world))
    out = {}
    for name in meta_sum.BENCHMARKS:
        bench = get_benchmark(name)
        ctx = BenchmarkContext(data_cfg, bench.options({}), base.family, "val", 0)
        data = bench.eval_data(ctx)
        result = bench.evaluate(ctx, data, EvalRunner(RandomScores(SHAPES[name](data)),
                                                      batch_size=7))
        out[name] = (result.metrics, result.predictions, data)
    return out


def test_each_part_is_computed_as_the_table_says(evaluated):
    for name, bench, metric, computed, *_ in TABLE:
        m, preds, data = evaluated[bench]
        assert m[metric] == pytest.approx(computed(m, preds, data)), name
    # a random model on the tiny world: every part strictly between 0 and 100, and the
    # parts differ (a swapped key would not hide behind equal values)
    values = [evaluated[bench][0][metric] for _, bench, metric, *_ in TABLE]
    assert all(0 < v < 100 for v in values) and len(set(values)) == len(values)


def test_finetune_parts_trial_report_and_leaderboard_follow_the_table(evaluated):
    from vlp.platform.finetune.run import BenchmarkReport, meta_parts
    from vlp.platform.sweep.trial_records import result_metrics
    from vlp.platform.sweep.trial_state import TrialState
    from vlp.platform.tracking.leaderboard import PARTS as COLUMNS

    reports = {b: BenchmarkReport(b, m, 1, 0.0, "") for b, (m, _, _) in evaluated.items()}
    scores = meta_parts(reports)                      # what a finetune logs as downstream.*
    expected = {name: evaluated[bench][0][metric] for name, bench, metric, *_ in TABLE}
    assert scores == expected
    total = sum(expected.values())                     # Table 3: the five parts, summed
    assert meta_sum.meta_sum(scores) == pytest.approx(total)

    reported = result_metrics(TrialState(scores=scores), 4, 4)     # the trial's Tune report
    for name, _, _, _, key, _ in TABLE:
        assert reported[key] == expected[name]
    assert reported["meta_sum"] == pytest.approx(total)
    # the leaderboard reads each part from the trial run under that key into that column
    # (test_leaderboard.py reads them back from MLflow, and its Meta-Sum cell, by hand)
    assert list(COLUMNS) == [(key, column) for *_, key, column in TABLE]
