"""Integration: the generic training loop on 2 Ray Train CPU workers with DeepSpeed ZeRO-2,
the toy model, two stages, gradient accumulation and one NaN batch per stage (skipped on
every rank); then the preflight that refuses a changed experiment under an existing name.

Stop, resume and a worker failure continuing with the very same per-step losses are tested
once, on real pretraining, in test_pretrain_train.py (the same loop; a second copy here cost
75 s of the suite's 15-minute budget).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlp.platform.pretrain.experiment_config import load_experiment_config
from vlp.platform.pretrain.run import run_pretraining
from vlp.testing.toy import ToyComponents
from vlp.platform.tracking.mlflow_run import RUN_KEY_TAG, embedded_tracking_uri, run_key

pytestmark = pytest.mark.integration

STEPS = 30
NAN_AT_CALL = 3            # rank 0's 3rd batch of each stage is NaN → dropped on every rank


def toy_config(root: Path, name: str, *overrides: str):
    return load_experiment_config(data={
        "run": {"name": name, "output_dir": str(root), "seed": 0, "max_failures": 1},
        "model": {"family": "toy"},
        "data": {"sources": {"web": {"path": "/unused/web"}, "coco": {"path": "/unused/coco"}}},
        "tasks": {"mlm": 1, "itm": 1, "mrfr": 1},
        "stages": [{"name": "web", "steps": 15, "sources": ["web"]},
                   {"name": "indomain", "steps": 15, "sources": ["coco"],
                    "tasks": {"mlm": 1, "mrfr": 1}}],
        "optimizer": {"lr": 2e-2, "warmup_steps": 3},
        "train": {"grad_accum": 2, "zero_stage": 2, "log_every": 5, "on_nonfinite": "skip"},
        "scaling": {"num_workers": 2, "cpus_per_worker": 1},
        "checkpoint": {"interval": 10, "keep": 2},
        "mlflow": {"metric_window": 1},     # a row per step: the steps' losses compared
    }, overrides=overrides)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("platform-runs")


@pytest.fixture(scope="module")
def straight(ray_local, root):
    return run_pretraining(toy_config(root, "straight"), ToyComponents(nan_at_call=NAN_AT_CALL))


def mlflow_runs(root: Path, name: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(embedded_tracking_uri(root))
    exp = client.get_experiment_by_name("vlp-pretrain")
    key = run_key(str(root.resolve()), name)
    return client, client.search_runs([exp.experiment_id],
                                      filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'")


def losses_by_step(history):
    return {h["step"]: h["loss"] for h in history}


def test_two_workers_zero2_two_stages_losses_fall_and_mlflow_holds_the_run(straight, root):
    r = straight
    assert r.completed and r.final_step == STEPS
    assert r.checkpoint_path == str(root / "straight" / "checkpoint_step00000030")
    assert r.return_value["checkpoint_path"] == r.checkpoint_path
    h = r.history
    assert [x["step"] for x in h] == list(range(1, STEPS + 1))
    assert [x["stage"] for x in h] == [0] * 15 + [1] * 15
    assert {t for x in h[15:] for t in x["tasks"]} <= {"mlm", "mrfr"}     # stage 2's mix
    assert all(len(x["tasks"]) == 2 for x in h)                             # grad_accum 2
    assert r.return_value["skipped_batches"] == 2                           # one NaN per stage
    first = sum(x["loss"] for x in h[:6]) / 6
    last = sum(x["loss"] for x in h[-6:]) / 6
    assert last < 0.8 * first, (first, last)
    assert r.return_value["examples_seen"] == sum(x["global_batch_examples"] for x in h)

    # Ray kept the last 2 checkpoints; each holds DeepSpeed's files and the trainer state
    kept = sorted(p.name for p in (root / "straight").glob("checkpoint_step*"))
    assert kept == ["checkpoint_step00000020", "checkpoint_step00000030"]
    ckpt = Path(r.checkpoint_path)
    assert json.loads((ckpt / "vlp_trainer.json").read_text())["step"] == STEPS
    assert {"vlp_rank_000.pt", "vlp_rank_001.pt", "latest"} <= {p.name for p in ckpt.iterdir()}
    assert len(list((ckpt / "step00000030").glob("zero_pp_rank_*_optim_states.pt"))) == 2

    client, runs = mlflow_runs(root, "straight")
    assert len(runs) == 1 and runs[0].info.run_id == r.mlflow_run_id
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["vlp.state"] == "completed"
    p = run.data.params
    assert p["optimizer.lr"] == "0.02" and p["stages.1.name"] == "indomain"
    assert p["train.zero_stage"] == "2" and p["tasks.mrfr"] == "1.0"
    assert int(p["derived.parameters"]) == r.return_value["parameters"]
    assert p["derived.global_batch_input_units_budget"] == str(4096 * 2 * 2)
    assert int(p["derived.global_batch_examples_step1"]) == h[0]["global_batch_examples"]
    logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    assert logged == pytest.approx(losses_by_step(h))
    for key in ("lr", "examples_per_s", "input_units_per_s", "mlm_loss", "mrfr_loss",
                "mlm_acc", "global_batch_examples"):
        assert client.get_metric_history(run.info.run_id, key), key
    artifacts = {a.path for d in ("config", "plots", "checkpoint")
                 for a in client.list_artifacts(run.info.run_id, d)}
    assert artifacts == {"config/experiment.yaml", "config/deepspeed.json",
                         "plots/loss_curve.png", "checkpoint/latest.json"}
    pointer = json.loads(Path(client.download_artifacts(
        run.info.run_id, "checkpoint/latest.json", str(root / "dl"))).read_text())
    assert pointer["checkpoint"] == r.checkpoint_path and pointer["completed"]


def test_a_changed_experiment_under_the_same_name_is_refused_before_compute(straight, root):
    from vlp.platform.pretrain.run import preflight, resolve

    with pytest.raises(ValueError, match="does not fit this config's stages"):
        preflight(resolve(toy_config(root, "straight", "stages.0.steps=20")))
    with pytest.raises(ValueError, match="written by 2 workers"):
        preflight(resolve(toy_config(root, "straight", "scaling.num_workers=1")))
    preflight(resolve(toy_config(root, "straight")))      # the same experiment: fine
