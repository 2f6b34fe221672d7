"""Integration: finetuning through the platform's Ray Train + DeepSpeed loop on the tiny
world — 2 workers, retrieval (whose evaluation scores every text–image pair, texts sharded
over the workers and gathered on rank 0), one MLflow child run under a given parent with the
scores and the predictions file, Meta-Sum parts, and a re-run that resumes and re-evaluates."""

from __future__ import annotations

import json

import pytest

from vlp.platform.finetune import finetune_and_evaluate
from vlp.platform.tracking.mlflow_run import MlflowRun, embedded_tracking_uri

pytestmark = pytest.mark.integration


def test_finetune_through_ray_train_logs_a_child_run(ray_local, tiny_world, tmp_path):
    uri = embedded_tracking_uri(tmp_path)
    parent = MlflowRun.open(uri, "vlp-pretrain", run_name="pretrain-trial")
    report = finetune_and_evaluate(
        None, ["retrieval"], world=str(tiny_world), run_name="ft", output_dir=str(tmp_path),
        parent_run_id=parent.run_id, tracking_uri=uri, num_workers=2,
        overrides=["settings.retrieval.steps=4", "settings.retrieval.batch_size=4",
                   "eval.batch_size=256"])
    r = report.benchmarks["retrieval"]
    assert r.steps == 4 and r.eval_split == "val" and r.eval_examples == 100
    assert set(report.scores) == {"ir", "tr"} and report.meta_sum is None
    assert 0 <= r.metrics["ir_r1"] <= r.metrics["ir_r5"] <= r.metrics["ir_r10"] <= 100
    assert report.scores["ir"] == pytest.approx(r.metrics["ir_mean"])
    preds = json.loads(open(r.predictions).read())
    assert len(preds["predictions"]) == 100 + 20          # 100 text queries + 20 image queries
    assert preds["metrics"] == r.metrics

    client = parent.client
    child = client.get_run(r.mlflow_run_id)
    assert child.data.tags["mlflow.parentRunId"] == parent.run_id
    assert child.data.params["finetune.benchmark"] == "retrieval"
    assert child.data.params["finetune.init"] == "random"
    # the protocol each score was finetuned with: logged, tagged on the parent, printed
    assert child.data.params["finetune.protocol"] == "margin"       # uniter-tiny's: UNITER §4.1
    assert child.data.params["finetune.protocol_source"] == "UNITER §4.1"
    assert client.get_run(parent.run_id).data.tags["downstream_protocol.retrieval"] == "margin"
    assert "retrieval.protocol margin (UNITER §4.1)" in report.lines()
    assert child.data.metrics["ir_r10"] == pytest.approx(r.metrics["ir_r10"])
    assert "retrieval_loss" in child.data.metrics                  # the loop's training curve
    arts = [a.path for a in client.list_artifacts(r.mlflow_run_id, "predictions")]
    assert arts == ["predictions/retrieval-val.json"]
    assert client.get_run(parent.run_id).data.metrics["downstream.ir"] == \
        pytest.approx(report.scores["ir"])
    # each part the parent run logs is computed as the hand-written Meta-Sum table says,
    # from the metrics the child run logged
    from test_meta_sum_table import TABLE
    logged = client.get_run(parent.run_id).data.metrics
    for part, bench, _, computed, *_ in TABLE:
        if bench == "retrieval":
            assert logged[f"downstream.{part}"] == pytest.approx(
                computed(child.data.metrics, None, None)), part

    # the same call again: the finished job resumes from its last checkpoint, trains no step
    # and evaluates the same weights into the same MLflow child run
    trained = [(m.step, m.value) for m in client.get_metric_history(r.mlflow_run_id,
                                                                     "retrieval_loss")]
    again = finetune_and_evaluate(
        None, ["retrieval"], world=str(tiny_world), run_name="ft", output_dir=str(tmp_path),
        parent_run_id=parent.run_id, tracking_uri=uri, num_workers=2,
        overrides=["settings.retrieval.steps=4", "settings.retrieval.batch_size=4",
                   "eval.batch_size=256"])
    r2 = again.benchmarks["retrieval"]
    assert r2.mlflow_run_id == r.mlflow_run_id and r2.metrics == r.metrics
    assert [(m.step, m.value) for m in client.get_metric_history(
        r.mlflow_run_id, "retrieval_loss")] == trained                 # 0 new steps
    children = client.search_runs([child.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent.run_id}'")
    assert [c.info.run_id for c in children] == [r.mlflow_run_id]
