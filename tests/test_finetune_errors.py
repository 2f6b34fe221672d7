"""Bad inputs fail before any worker starts, with the cause named: a checkpoint of another
family, vocabulary or feature width, a benchmark that does not exist, a task table whose
image ids are missing from the shards; and the checkpoint layouts that do load."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from vlp.datasets.downstream import MissingImagesError
from vlp.datasets.storage.shards import read_image_shard, write_image_shard
from vlp.datasets.storage.world import load_manifest
from vlp.models import create_model
from vlp.models.checkpoints import CheckpointError
from vlp.contract.config_loader import ConfigError
from vlp.platform.training import pretrained_weights as ckpt
from vlp.platform.finetune import load_finetune_config
from vlp.platform.finetune.preflight import prepare
from vlp.platform.finetune.run import components_for


def config(world, checkpoint="", **extra):
    data = {"world": str(world), "benchmarks": ["vqa", "nlvr2"],
            "model": {"init": "checkpoint" if checkpoint else "random",
                      "checkpoint": str(checkpoint)}, **extra}
    return load_finetune_config(data=data).resolved_paths()


def save(path, family="uniter-tiny", **kw):
    model, _, _ = create_model(family, ["itm", "mlm"], region_feat_dim=kw.pop("feat", 64), **kw)
    torch.save(model.state_dict(), path)
    return model


def test_a_checkpoint_of_another_family_is_named(tiny_world, tmp_path):
    save(tmp_path / "ib.pt", "imagebert-tiny")
    with pytest.raises(CheckpointError, match="family 'imagebert-tiny', not 'uniter-tiny'"):
        prepare(config(tiny_world, tmp_path / "ib.pt"))


def test_another_vocabulary_or_feature_width_is_refused(tiny_world, tmp_path):
    save(tmp_path / "cased.pt", vocab_size=28996)
    with pytest.raises(CheckpointError, match="vocabulary has 28996 tokens, the tokenizer 30522"):
        prepare(config(tiny_world, tmp_path / "cased.pt"))
    save(tmp_path / "wide.pt", feat=2048)
    with pytest.raises(CheckpointError, match=r"img_linear.*\[64, 2048\].*feature width"):
        prepare(config(tiny_world, tmp_path / "wide.pt"))
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        prepare(config(tiny_world, tmp_path / "nothing.pt"))


def test_platform_checkpoint_folders_and_run_folders_load(tiny_world, tmp_path):
    """The layout the pretraining loop writes: Ray checkpoint folder → DeepSpeed tag folder."""
    run = tmp_path / "runs" / "pre"
    model, _, _ = create_model("uniter-tiny", ["itm", "mlm"], region_feat_dim=64)
    for step in (5, 10):
        folder = run / f"checkpoint_step{step:08d}"
        (folder / f"step{step:08d}").mkdir(parents=True)
        (folder / "vlp_trainer.json").write_text(json.dumps({"step": step,
                                                             "tag": f"step{step:08d}"}))
        torch.save({"module": model.state_dict(), "global_steps": step},
                   folder / f"step{step:08d}" / "mp_rank_00_model_states.pt")
    weights = ckpt.read(run)                                      # the run folder: latest
    assert weights.step == 10 and weights.path.endswith("mp_rank_00_model_states.pt")
    cfg = config(tiny_world, run)
    prepared = prepare(cfg)
    assert prepared.checkpoint_step == 10
    _, bs, _, options = cfg.settings_for("nlvr2")
    built = components_for(cfg, "nlvr2", prepared, bs, options).build_model(None, [])
    for k, v in model.backbone.state_dict().items():
        if "token_type" not in k:
            torch.testing.assert_close(built.backbone.state_dict()[k], v, msg=k)
    (run / "checkpoint_step00000010" / "step00000010" / "mp_rank_00_model_states.pt").unlink()
    with pytest.raises(CheckpointError, match="interrupted while saving"):
        ckpt.read(run / "checkpoint_step00000010")


def test_unknown_benchmark_and_options_name_the_key(tiny_world):
    with pytest.raises(ConfigError) as e:
        load_finetune_config(data={"world": str(tiny_world), "model": {"init": "random"},
                                   "benchmarks": ["vqa", "refcoco"],
                                   "settings": {"nlvr2": {"options": {"variant": "quad"}},
                                                "gqa": {"steps": 3}}})
    text = str(e.value)
    assert "benchmarks.1: unknown benchmark 'refcoco' (did you mean 'refcoco+'?)" in text
    assert "settings.nlvr2.options.variant" in text and "settings.gqa" in text
    with pytest.raises(ConfigError, match="model.checkpoint: required"):
        load_finetune_config(data={"world": str(tiny_world)})


def test_missing_image_ids_are_caught_before_training(tiny_world, tmp_path):
    world = tmp_path / "world"
    shutil.copytree(tiny_world, world)
    shard = load_manifest(world).image_files("downstream", "val")[0]
    table, info = read_image_shard(shard)
    write_image_shard(shard, table.slice(0, table.num_rows - 2),
                      feature_extractor=info.feature_extractor, feature_dim=info.feature_dim,
                      num_classes=info.num_classes)
    with pytest.raises(MissingImagesError, match=r"tasks/vqa/val.parquet: 2 of 20 image ids "
                                                 r"are missing from the feature shards"):
        prepare(config(world))


def test_the_commands_exit_non_zero_with_one_line(tiny_world, tmp_path, capsys):
    import runpy

    from vlp.cli import build_parser, main

    code = main(["finetune", "--world", str(tiny_world), "--checkpoint", "none",
                 "--benchmarks", "vqa,nlvr3", "--no-mlflow"])
    err = capsys.readouterr().err
    assert code == 1 and err.strip().count("\n") == 0 and "did you mean 'nlvr2'" in err
    job = runpy.run_path("jobs/finetune.py", run_name="job")
    code = job["main"](["--world", str(tmp_path / "none"), "--checkpoint", "none",
                        "--no-mlflow"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("finetune failed:") and "no such folder" in err
    assert err.strip().count("\n") == 0
    code = main(["evaluate", "--world", str(tiny_world), "--checkpoint", "none"])
    assert code == 1 and "--checkpoint PATH is required" in capsys.readouterr().err
    text = build_parser()._subparsers._group_actions[0].choices["finetune"].format_help()
    assert "Meta-Sum" in text and "refcoco+-gt" in text and "--checkpoint" in text
