"""Where finetune runs go in MLflow (nested under the pretraining run that wrote the
checkpoint, or under a parent of their own), and zero-shot retrieval from the ITM head."""

from __future__ import annotations

import json

import pytest
import torch

from vlp.models import create_model
from vlp.models.checkpoints import CheckpointError
from vlp.platform.finetune import load_finetune_config, tracking
from vlp.platform.finetune.preflight import prepare
from vlp.platform.finetune.run import components_for
from vlp.platform.training.protocols import WorkerInfo
from vlp.platform.tracking.mlflow_run import MlflowRun, embedded_tracking_uri, run_key


def fake_pretraining_checkpoint(root, tasks=("itm", "mlm")):
    model, _, _ = create_model("uniter-tiny", list(tasks), region_feat_dim=64)
    folder = root / "pre" / "checkpoint_step00000007"
    (folder / "step00000007").mkdir(parents=True)
    (folder / "vlp_trainer.json").write_text(json.dumps({"step": 7, "tag": "step00000007"}))
    torch.save({"module": model.state_dict()}, folder / "step00000007" /
               "mp_rank_00_model_states.pt")
    return model, folder


def test_finetunes_nest_under_the_pretraining_run_of_the_checkpoint(tmp_path):
    _, folder = fake_pretraining_checkpoint(tmp_path)
    uri = embedded_tracking_uri(tmp_path)
    pre = MlflowRun.open(uri, "vlp-pretrain", run_name="pre",
                         key=run_key(str(tmp_path.resolve()), "pre"))
    assert tracking.pretraining_run_of(str(folder)) == (uri, pre.run_id)
    parent = tracking.resolve_parent(tracking_uri="", experiment="vlp-finetune", run_name="ft",
                                     output_dir=str(tmp_path / "ft"), checkpoint=str(folder))
    assert (parent.run_id, parent.experiment, parent.owned) == (pre.run_id, "vlp-pretrain", False)
    # no pretraining run to find: a parent of its own, found again on a re-run
    own = tracking.resolve_parent(tracking_uri="", experiment="vlp-finetune", run_name="ft",
                                  output_dir=str(tmp_path / "ft"))
    again = tracking.resolve_parent(tracking_uri="", experiment="vlp-finetune", run_name="ft",
                                    output_dir=str(tmp_path / "ft"))
    assert own.owned and own.run_id == again.run_id and own.run_id != pre.run_id
    tracking.log_summary(own, {"vqa": 50.0, "ir": 1, "tr": 2, "nlvr2": 3, "refcoco+": 4}, 60.0)
    run = MlflowRun.open(own.tracking_uri, "vlp-finetune", run_name="x", run_id=own.run_id)
    metrics = run.client.get_run(own.run_id).data.metrics
    assert metrics["downstream.meta_sum"] == 60.0 and metrics["downstream.vqa"] == 50.0


def test_zero_shot_retrieval_scores_with_the_pretrained_itm_head(tiny_world, tmp_path):
    model, folder = fake_pretraining_checkpoint(tmp_path)
    cfg = load_finetune_config(data={"world": str(tiny_world), "benchmarks": ["retrieval"],
                                     "model": {"checkpoint": str(folder)},
                                     "mlflow": {"enabled": False}}).resolved_paths()
    _, bs, _, options = cfg.settings_for("retrieval")
    comp = components_for(cfg, "retrieval", prepare(cfg), bs, options, zero_shot=True)
    zs = comp.build_model(None, [])
    head = model.heads["itm"]
    torch.testing.assert_close(zs.head.out.weight[0], head.weight[1] - head.weight[0])
    out = comp.after_training(None, zs, WorkerInfo(0, 1, 0, torch.device("cpu"), 0))
    assert out["eval_split"] == "val" and out["eval_examples"] == 100
    assert 0 <= out["metrics"]["ir_r1"] <= out["metrics"]["ir_r10"] <= 100
    _, no_itm = fake_pretraining_checkpoint(tmp_path / "b", tasks=("mlm",))
    comp2 = components_for(load_finetune_config(data={
        "world": str(tiny_world), "benchmarks": ["retrieval"],
        "model": {"checkpoint": str(no_itm)}}).resolved_paths(), "retrieval", prepare(cfg), bs,
        options, zero_shot=True)
    with pytest.raises(CheckpointError, match="pretrained ITM head"):
        comp2.build_model(None, [])
