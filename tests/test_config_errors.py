"""The typed-config layer over pydantic: pydantic's errors read as vlp's one-line problems
(dotted key, what was expected, "did you mean", the file), sections keep their rules when left
out, the one aliased key, frozen and picklable configs."""

from __future__ import annotations

import pickle

import pytest

from vlp.contract.config_loader import ConfigError, load_config
from vlp.datasets.stream.data_config import DataConfig, SourceConfig
from vlp.platform.pretrain.experiment_config import ExperimentConfig, load_experiment_config

BASE = {
    "run": {"name": "t", "output_dir": "/tmp/vlp-test-runs"},
    "data": {"sources": {"coco": {"path": "/data/coco"}}},
    "train": {"steps": 100},
    "optimizer": {"warmup_steps": 10},
}


def problems(*overrides: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as e:
        load_experiment_config(data=BASE, overrides=overrides)
    return dict(e.value.problems)


def test_unknown_nested_key_lists_the_known_ones_and_suggests_the_nearest():
    msg = problems("optimizer.lrr=1e-4")["optimizer.lrr"]
    assert msg.startswith("unknown key (known: lr, betas, eps, weight_decay,")
    assert msg.endswith("(did you mean 'lr'?)")
    assert "did you mean 'tasks'?" in problems("taks={mlm: 1}")["taks"]


def test_a_limit_message_names_every_limit_of_the_field_and_the_value():
    p = problems("optimizer.betas=[0.9, 1.5]", "scaling.num_workers=0", "optimizer.lr=-1",
                 "train.grad_accum=1.5", "model.dropout=.inf")
    assert p["optimizer.betas.1"] == "expected a finite number ≥ 0 and < 1, got 1.5"
    assert p["scaling.num_workers"] == "expected an integer ≥ 1, got 0"
    assert p["optimizer.lr"] == "expected a finite number > 0, got -1"
    assert p["train.grad_accum"] == "expected an integer, got 1.5 (float)"
    assert p["model.dropout"] == "expected a finite number ≥ 0 and < 1, got inf"


def test_choices_types_and_missing_keys_read_as_before():
    p = problems("train.precision=fp61", "scaling.use_gpu=[1]", "stages=[{name: a}]",
                 "train.steps=0", "data.sources.coco=3")
    assert p["train.precision"] == ("expected one of 'auto', 'fp32', 'bf16', 'fp16', got "
                                    "'fp61' (str) (did you mean 'fp16'?)")
    assert p["scaling.use_gpu"] == "expected true or false, got [1] (list)"
    assert p["stages.0.steps"] == "required: an integer"
    assert p["data.sources.coco"] == "expected a mapping, got 3 (int)"


def test_a_boolean_is_no_number_and_a_number_no_boolean():
    p = problems("train.log_every=true", "optimizer.lr=false", "scaling.use_gpu=1")
    assert p == {"train.log_every": "expected an integer, got True (bool)",
                 "optimizer.lr": "expected a number, got False (bool)",
                 "scaling.use_gpu": "expected true or false, got 1 (int)"}
    cfg = load_experiment_config(data=BASE, overrides=["optimizer.lr=5e-4", "train.compile=yes"])
    assert cfg.optimizer.lr == 5e-4 and cfg.train.compile is True   # YAML's own readings


def test_the_error_is_one_line_per_problem_and_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("run: {name: t}\ntrain: {steps: 10, precison: bf16}\n"
                    "data: {sources: {coco: {path: /d}}}\noptimizer: {warmup_steps: 1}\n")
    with pytest.raises(ConfigError) as e:
        load_config(ExperimentConfig, path)
    assert str(e.value) == (f"invalid config ({path}): train.precison: unknown key (known: "
                            "steps, grad_accum, objective, forward_groups, precision, zero_stage, "
                            "grad_overlap, grad_bucket_elements, grad_wire_dtype, "
                            "interconnect_check, interconnect_mb, "
                            "activation_checkpointing, compile, cuda_graphs, prefetch_batches, "
                            "batch_builder, batch_builders, peak_tflops, log_every, on_nonfinite, "
                            "max_nonfinite_skips, stop_after, extensions_dir) "
                            "(did you mean 'precision'?)")
    assert e.value.source == str(path)


def test_a_section_left_out_still_runs_its_rules_and_an_empty_one_takes_defaults():
    data = {k: v for k, v in BASE.items() if k != "run"} | {"mlflow": None}
    cfg = load_experiment_config(data=data)
    assert cfg.run.name == "pretrain" and cfg.mlflow.experiment == "vlp-pretrain"
    from vlp.platform.finetune.finetune_config import load_finetune_config

    # no model section: its default init (checkpoint) needs a checkpoint path
    with pytest.raises(ConfigError, match=r"model.checkpoint: required with model.init"):
        load_finetune_config(data={"world": "w"})


def test_the_renamed_batch_key_is_checked_under_the_name_the_user_writes():
    p = problems("data.batch_input_units=50")
    assert p["data.batch_input_units"].startswith("is 50 but one example can take 162 input")
    assert "did you mean 'batch_input_units'?" in problems("data.batch_units=4096")[
        "data.batch_units"]


def test_configs_are_picklable_and_frozen_where_the_pipeline_relies_on_it():
    cfg = load_experiment_config(data=BASE)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    data = DataConfig(sources=(SourceConfig("coco", "/d", 2.0),))
    assert pickle.loads(pickle.dumps(data)) == data and hash(data) == hash(data.model_copy())
    with pytest.raises(Exception, match="frozen"):
        data.seed = 3
    err = pickle.loads(pickle.dumps(ConfigError([("a.b", "expected x")], "f.yaml")))
    assert err.problems == [("a.b", "expected x")] and str(err) == \
        "invalid config (f.yaml): a.b: expected x"


def test_cuda_graphs_are_refused_before_any_worker_where_the_config_shows_they_cannot_run():
    """What train.cuda_graphs needs that the config alone shows is checked at load (a CPU
    job, micro-batches accumulated, the host's non-finite skip, a step that is not the
    device step), one line each; the worker checks the device it gets and its world size."""
    def said(*overrides: str) -> list[str]:
        with pytest.raises(ConfigError) as e:
            load_experiment_config(data=BASE, overrides=("train.cuda_graphs=true",) + overrides)
        return [m for k, m in e.value.problems if k == "train.cuda_graphs"]

    cpu = said("scaling.num_workers=1", "train.precision=bf16")
    assert len(cpu) == 1 and "scaling.use_gpu is false" in cpu[0]
    every = said("train.grad_accum=2", "train.on_nonfinite=skip", "train.precision=fp32")
    assert len(every) == 4 and all("\n" not in m for m in every)
    for words in ("use_gpu", "grad_accum is 2", "on_nonfinite", "precision fp32"):
        assert any(words in m for m in every), (words, every)
    # several workers (2 by default) are the worker's to refuse: `vlp pretrain --local` runs
    # such a config on one
    gpu = said("scaling.use_gpu=true", "train.precision=bf16", "train.grad_accum=2")
    assert len(gpu) == 1 and "grad_accum is 2" in gpu[0]
    cfg = load_experiment_config(data=BASE, overrides=(
        "train.cuda_graphs=true", "scaling.use_gpu=true", "scaling.num_workers=1",
        "train.precision=bf16"))
    assert cfg.train.cuda_graphs
