"""Typed config machinery and the pretraining experiment config: loading, overrides,
validation errors (each naming its dotted key), flatten / to_yaml."""

from __future__ import annotations

import pytest

from vlp.contract.config_loader import (ConfigError, apply_overrides, flatten, load_config, redact,
                                        to_yaml)
from vlp.platform.pretrain.experiment_config import ExperimentConfig, load_experiment_config
from vlp.tasks import task_names

BASE = {
    "run": {"name": "t", "output_dir": "/tmp/vlp-test-runs"},
    "data": {"sources": {"coco": {"path": "/data/coco"}, "cc": {"path": "/data/cc",
                                                               "weight": 0.5}}},
    "train": {"steps": 100},
    "optimizer": {"warmup_steps": 10},
}


def load(*overrides: str, data: dict | None = None, **kw) -> ExperimentConfig:
    return load_experiment_config(data=BASE if data is None else data, overrides=overrides, **kw)


def problems(*overrides: str, data: dict | None = None, **kw) -> dict[str, str]:
    with pytest.raises(ConfigError) as e:
        load(*overrides, data=data, **kw)
    return dict(e.value.problems)


def test_defaults_follow_the_uniter_recipe():
    cfg = load()
    assert cfg.optimizer.lr == 5e-5 and cfg.optimizer.betas == (0.9, 0.98)
    assert cfg.optimizer.weight_decay == 0.01 and cfg.optimizer.grad_clip == 5.0
    assert cfg.tasks == {"itm": 2.0, "mlm": 2.0, "mrfr": 1.0, "mrc-kl": 1.0}
    assert cfg.data.masking == "conditional"
    plan = cfg.stage_plan()
    assert [(s.name, s.steps, s.sources) for s in plan] == [("pretrain", 100, ["coco", "cc"])]
    assert cfg.total_steps() == 100


def test_yaml_file_and_overrides_parse_values_as_yaml(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("run: {name: y, output_dir: /tmp/r}\n"
                    "data: {sources: {coco: {path: /d}}}\n"
                    "train: {steps: 50}\noptimizer: {warmup_steps: 5, lr: 5e-5}\n")
    cfg = load_config(ExperimentConfig, path, ["optimizer.lr=1e-4",      # YAML reads as str
                                               "optimizer.betas=[0.9, 0.99]",
                                               "tasks={mlm: 1, itm: 3}",
                                               "train.precision=bf16",
                                               "scaling.use_gpu=false", "run.name=2024"])
    assert cfg.optimizer.lr == 1e-4 and cfg.optimizer.betas == (0.9, 0.99)
    assert cfg.tasks == {"mlm": 1.0, "itm": 3.0}
    assert cfg.train.precision == "bf16" and cfg.run.name == "2024"


def test_overrides_index_lists_and_reject_malformed_items():
    raw = apply_overrides({"stages": [{"name": "a", "steps": 1}]}, ["stages.0.steps=7"])
    assert raw["stages"][0]["steps"] == 7
    with pytest.raises(ConfigError, match="key.sub=value"):
        apply_overrides({}, ["optimizer.lr"])
    with pytest.raises(ConfigError, match="stages.3"):
        apply_overrides({"stages": []}, ["stages.3.steps=1"])


def test_unknown_key_names_the_dotted_key_and_suggests():
    p = problems("optimizer.learning_rate=1e-4")
    assert "optimizer.learning_rate" in p
    assert "unknown key" in p["optimizer.learning_rate"]
    p = problems("optimzer.lr=1e-4")
    assert "did you mean 'optimizer'?" in p["optimzer"]


def test_unknown_task_with_suggestion_and_registry_hook():
    p = problems("tasks={mlm: 1, mrc_kl: 1}")
    assert "did you mean 'mrc-kl'?" in p["tasks.mrc_kl"]
    # a caller's list replaces the task registry's
    assert "tasks.itm" in problems("tasks={mlm: 1, itm: 1}", task_names=["mlm"])
    assert set(task_names()) >= {"mlm", "itm", "mrfr", "mrc", "mrc-kl", "moc", "mrc-vlbert",
                                "mvm", "wra"}


def test_mix_ratios_non_negative_and_not_all_zero():
    assert "≥ 0" in problems("tasks={mlm: -1, itm: 1}")["tasks.mlm"]
    assert "all mix ratios are 0" in problems("tasks={mlm: 0, itm: 0}")["tasks"]
    assert "tasks" in problems("tasks={}")


def test_fp16_on_cpu_is_refused_with_a_clear_error():
    msg = problems("train.precision=fp16")["train.precision"]
    assert "not supported on CPU" in msg and "bf16" in msg
    assert load("train.precision=fp16", "scaling.use_gpu=true").train.precision == "fp16"


def test_types_and_ranges_are_all_reported_at_once():
    p = problems("optimizer.lr=abc", "train.zero_stage=3", "scaling.num_workers=0",
                 "optimizer.betas=[0.9, 1.5]", "data.masking=jiont", "train.grad_accum=1.5")
    assert p["optimizer.lr"].startswith("expected a number")
    assert "0, 1, 2" in p["train.zero_stage"]
    assert "≥ 1" in p["scaling.num_workers"]
    assert "< 1" in p["optimizer.betas.1"]
    assert "did you mean 'joint'?" in p["data.masking"]
    assert "integer" in p["train.grad_accum"]


def test_stages_are_checked_against_sources_tasks_and_steps():
    stages = "stages=[{name: web, steps: 40, sources: [cc]}, {name: indomain, steps: 60, " \
             "sources: [coco], tasks: {mlm: 1, mrfr: 1}}]"
    cfg = load(stages, "train.steps=0")
    plan = cfg.stage_plan()
    assert [s.name for s in plan] == ["web", "indomain"] and cfg.total_steps() == 100
    assert plan[0].tasks == cfg.tasks and plan[1].tasks == {"mlm": 1.0, "mrfr": 1.0}
    assert cfg.all_tasks() == ["itm", "mlm", "mrfr", "mrc-kl"]
    p = problems("stages=[{name: a, steps: 5, sources: [sbu]}, {name: a, steps: 5}]",
                 "optimizer.warmup_steps=0")
    assert "unknown data source 'sbu'" in p["stages.0.sources.0"]
    assert "duplicate" in p["stages.1.name"]
    assert "sum to 10" in p["train.steps"]
    assert "required" in problems("stages=[{name: a}]", "train.steps=0")["stages.0.steps"]
    assert "never decay" in problems("optimizer.warmup_steps=100")["optimizer.warmup_steps"]


def test_model_init_and_family_registry_hook():
    assert "required" in problems("model.init=uniter")["model.init_path"]
    cfg = load("model.init=uniter", "model.init_path=/ckpt/uniter-base.pt")
    assert cfg.model.init_spec() == "uniter:/ckpt/uniter-base.pt"
    assert load("model.init=minilm").model.init_spec() == "minilm"
    assert "only used with" in problems("model.init_path=/x")["model.init_path"]
    p = problems("model.family=uniter-tiyn", families=["uniter-tiny", "uniter-base"])
    assert "did you mean 'uniter-tiny'?" in p["model.family"]


def test_flatten_for_mlflow_params_never_holds_secrets():
    cfg = load("mlflow.tracking_uri=https://alice:s3cret@mlflow.example:5000",
               "stages=[{name: a, steps: 100}]", "train.steps=0")
    flat = flatten(cfg)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in flat.items())
    assert flat["optimizer.lr"] == "5e-05"
    assert flat["optimizer.betas"] == "[0.9, 0.98]"
    assert flat["tasks.mrc-kl"] == "1.0"
    assert flat["data.sources.cc.weight"] == "0.5"
    assert flat["stages.0.name"] == "a" and flat["stages.0.sources"] == "[]"
    assert flat["mlflow.tracking_uri"] == "https://alice:***@mlflow.example:5000"
    assert "s3cret" not in "".join(flat.values())
    assert flatten({"db": {"password": "hunter2", "tokens": 7}}) == {"db.password": "***",
                                                                    "db.tokens": "7"}
    assert redact("postgresql://u:pw@h/db and http://x@y") == \
        "postgresql://u:***@h/db and http://x@y"


def test_to_yaml_round_trips():
    cfg = load("stages=[{name: a, steps: 100, tasks: {mlm: 1}}]", "train.steps=0")
    import yaml

    again = load_experiment_config(data=yaml.safe_load(to_yaml(cfg)))
    assert again == cfg
