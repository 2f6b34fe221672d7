"""Issue 29, SOHO: BERT into a shallower Transformer takes BERT's first L layers (SOHO §4.1
initialises its 3-layer ablation model from BERT), widths that differ are refused; the step
schedule (×0.1 at epochs 25 and 35 of 40, §4.1) for both optimizers."""

from __future__ import annotations

import logging

import pytest
import torch

from vlp.models.checkpoints.state_dict_io import CheckpointError, read_state_dict
from vlp.models.checkpoints.text_bert import minilm_dir
from vlp.models.factory import create_model


def test_bert_into_three_layers_loads_the_first_three_layers_exactly(caplog):
    with caplog.at_level(logging.INFO, logger="vlp.models.checkpoints.text_bert"):
        model, _, report = create_model("uniter-minilm", ["mlm"], init="minilm",
                                        overrides={"transformer.num_layers": 3})
    bert = read_state_dict(minilm_dir() / "model.safetensors")
    ours = model.state_dict()
    compared = 0
    for key, value in bert.items():
        name = key.removeprefix("bert.")
        if name.startswith("encoder.layer."):
            layer = int(name.split(".")[2])
            if layer < 3:
                assert torch.equal(ours["backbone." + name], value.float()), key
                compared += 1
            else:
                assert key in report.dropped and "first 3" in report.dropped[key]
    assert compared == 3 * 16   # every tensor of layers 0-2
    assert torch.equal(ours["backbone.text_embeddings.word_embeddings.weight"],
                       bert["embeddings.word_embeddings.weight"].float())
    assert any("6 encoder layers into a 3-layer model" in r.getMessage()
               for r in caplog.records)


def test_bert_of_another_width_is_refused():
    with pytest.raises(CheckpointError, match="shape"):
        create_model("uniter-minilm", ["mlm"], init="minilm",
                     overrides={"transformer.num_layers": 3, "transformer.hidden_size": 192,
                                "transformer.intermediate_size": 768,
                                "transformer.num_heads": 6})


def test_the_step_schedule_drops_both_optimizers_lr_at_the_milestones():
    """SOHO §4.1: ×0.1 at epochs 25 and 35 of 40, here 40 steps: milestones 25 and 35, the
    CNN's SGD and the Transformer's AdamW alike, through the experiment config."""
    from vlp.platform.pretrain.run import loop_config
    from vlp.platform.training.cnn_recipe import build_cnn_recipe
    from vlp.platform.training.engine import cnn_recipe_for, schedule_for

    from test_summed_objective import experiment

    cfg = loop_config(experiment("soho-tiny", "train.steps=40", "optimizer.warmup_steps=0",
                                 "optimizer.schedule=step", "optimizer.milestones=[25,35]"))
    schedule = schedule_for(cfg.optimizer, 40)
    model, _, _ = create_model("soho-tiny", ["mlm", "itm", "mvm"])
    recipe = cnn_recipe_for(model, cfg, schedule)
    assert recipe is not None and build_cnn_recipe is not None
    opt = recipe.optimizer
    sched = recipe.scheduler(opt)
    base = [g["lr"] for g in opt.param_groups]
    assert sorted({g["algo"] for g in opt.param_groups}) == ["adamw", "sgd"]
    seen = {}
    for step in range(40):            # the lr the step-th optimizer step (0-based) uses
        seen[step] = [g["lr"] for g in opt.param_groups]
        opt.step()
        sched.step()
    for step, factor in ((0, 1.0), (24, 1.0), (25, 0.1), (34, 0.1), (35, 0.01), (39, 0.01)):
        assert seen[step] == pytest.approx([b * factor for b in base]), step


def test_a_step_schedule_without_milestones_is_named():
    from vlp.contract.config_loader import ConfigError

    from test_summed_objective import experiment

    with pytest.raises(ConfigError, match="optimizer.milestones"):
        experiment("soho-tiny", "optimizer.schedule=step")


def test_the_shipped_recipes_carry_the_papers_numbers():
    """SOHO §4.1 (ImageNet CNN, BERT Transformer, ×0.1 at 25 and 35 of 40 epochs) and VL-BERT
    §3.3 / §4.1 (Task #1 SIRP, score > 0.5, 8k warm-up, lr 1e-4)."""
    from pathlib import Path

    from vlp.platform.pretrain.experiment_config import load_experiment_config

    configs = Path(__file__).resolve().parents[1] / "jobs" / "configs"
    soho = load_experiment_config(configs / "soho-r18-l3.yaml")
    assert soho.model.init == "bert" and soho.model.cnn_init
    steps = soho.train.steps
    assert soho.optimizer.schedule == "step" and soho.optimizer.decay_factor == 0.1
    assert soho.optimizer.milestones == [steps * 25 // 40, steps * 35 // 40]
    assert soho.model.cold_start_steps == steps * 10 // 40
    vlbert = load_experiment_config(configs / "vlbert-base.yaml")
    assert vlbert.tasks == {"sirp": 1, "mlm": 1, "mrc-vlbert": 1}
    assert vlbert.data.regions.conf_threshold == 0.5
    assert (vlbert.optimizer.lr, vlbert.optimizer.warmup_steps) == (1e-4, 8000)
