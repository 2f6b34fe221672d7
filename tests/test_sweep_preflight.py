"""Bad sweep inputs fail before any trial starts (no Ray here), each naming its key: an empty
or contradictory space, tasks that do not fit the family, an unknown replay, keys the sweep
owns, a missing world, bad pretraining or finetune settings. A good config passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlp.contract.config_loader import ConfigError
from vlp.platform.sweep import load_sweep_config
from vlp.platform.sweep.preflight import check_sweep

CONFIG = Path(__file__).resolve().parents[1] / "jobs" / "configs" / "sweep-tiny.yaml"


def load(world, tmp_path, *overrides: str):
    return load_sweep_config(CONFIG, [f"world={world}", f"sweep.output_dir={tmp_path}",
                                      *overrides]).resolved()


def problems(world, tmp_path, *overrides: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as e:
        check_sweep(load(world, tmp_path, *overrides))
    return dict(e.value.problems)


def test_the_tiny_sweep_config_passes(tiny_world, tmp_path):
    plan = check_sweep(load(tiny_world, tmp_path))
    assert [name for name, _ in plan.first] == ["none", "paper-best"]
    assert plan.first[1][1].mix_label() == "MLM+ITM+MRC-kl+MRFR"
    assert not (tmp_path / "sweep-tiny").exists()         # nothing written before the run


def test_unknown_replay(tiny_world, tmp_path):
    found = problems(tiny_world, tmp_path, "sweep.replay=tabel3")
    assert "unknown replay 'tabel3'" in found["sweep.replay"]


def test_table3_needs_a_family_that_takes_the_text_init(tiny_world, tmp_path):
    found = problems(tiny_world, tmp_path, "sweep.replay=table3", "model.text_init=minilm")
    assert "uniter-minilm" in found["sweep.replay"]
    found = problems(tiny_world, tmp_path, "sweep.replay=table3",
                     "model.text_init=bert:/no/such/bert")
    assert "names no file or folder" in found["sweep.replay"]


def test_table3_replay_passes_with_world_text_init(tiny_world, tmp_path):
    plan = check_sweep(load(tiny_world, tmp_path, "sweep.replay=table3"))
    assert [n for n, _ in plan.lines] == [f"L{i:02d}" for i in range(1, 14)]


def test_a_replay_can_run_some_of_its_lines(tiny_world, tmp_path):
    plan = check_sweep(load(tiny_world, tmp_path, "sweep.replay=table3",
                            "sweep.lines=[L10,L01,L06]"))
    assert [n for n, _ in plan.lines] == ["L01", "L06", "L10"]     # the paper's order
    found = problems(tiny_world, tmp_path, "sweep.replay=table3", "sweep.lines=[L01,L14]")
    assert "table3 has no line L14" in found["sweep.lines"]
    found = problems(tiny_world, tmp_path, "sweep.lines=[L01]")
    assert "sweep.replay is not set" in found["sweep.lines"]


def test_task_not_valid_for_the_family(tiny_world, tmp_path):
    found = problems(tiny_world, tmp_path, "space.tasks=[mlm,itm,mvm]", "sweep.include=[none]")
    assert "'mvm' does not apply to uniter-tiny" in found["space.tasks.2"]


def test_unknown_family(tiny_world, tmp_path):
    found = problems(tiny_world, tmp_path, "model.family=uniter-tinny")
    assert "did you mean 'uniter-tiny'" in found["model.family"]


def test_include_point_that_contradicts_the_space(tiny_world, tmp_path):
    found = problems(tiny_world, tmp_path, "space.tasks=[mlm,itm]", "space.no_pretraining=false")
    assert "contradicts the space" in found["sweep.include.0"]        # none
    assert "mrc-kl, mrfr" in found["sweep.include.1"]                 # paper-best


def test_empty_space(tiny_world, tmp_path):
    with pytest.raises(ConfigError) as e:
        load(tiny_world, tmp_path, "space.tasks=[]", "space.no_pretraining=false")
    assert "the space is empty" in dict(e.value.problems)["space.tasks"]


def test_unknown_include_and_too_many(tiny_world, tmp_path):
    found = problems(tiny_world, tmp_path, "sweep.include=[none,best]")
    assert "unknown point 'best'" in found["sweep.include.1"]
    with pytest.raises(ConfigError, match="sweep.num_samples is 1"):
        load(tiny_world, tmp_path, "sweep.num_samples=1")


def test_keys_the_sweep_owns_are_refused(tiny_world, tmp_path):
    with pytest.raises(ConfigError) as e:
        load(tiny_world, tmp_path, "pretrain.tasks={mlm: 1}", "pretrain.data.masking=joint",
             "pretrain.run.name=x")
    found = dict(e.value.problems)
    assert "space.tasks" in found["pretrain.tasks"]
    assert "space.masking" in found["pretrain.data.masking"]
    assert "sweep.name" in found["pretrain.run.name"]


def test_missing_world(tiny_world, tmp_path):
    found = problems(tmp_path / "nowhere", tmp_path)
    assert "no such folder" in found["world"]


def test_bad_pretraining_and_finetune_settings(tiny_world, tmp_path):
    found = problems(tiny_world, tmp_path, "pretrain.optimizer.warmup_steps=10",
                     "finetune.benchmarks=[vqa,retreival]")
    assert "finetune.benchmarks.1" in found
    found = problems(tiny_world, tmp_path, "pretrain.optimizer.warmup_steps=10")
    assert "warmup" in " ".join(found)


def test_data_choice_without_sources(tiny_world, tmp_path):
    """A world without out-of-domain corpora cannot serve space.data 'out'."""
    import json
    import shutil

    world = tmp_path / "world"
    shutil.copytree(tiny_world, world)
    manifest = json.loads((world / "manifest.json").read_text())
    for name in ("cc", "sbu"):
        manifest["sources"][name]["domain"] = "in"
    (world / "manifest.json").write_text(json.dumps(manifest))
    found = problems(world, tmp_path, "space.data=[in,out]")
    assert "out-domain" in found["space.data"]


def test_a_text_init_that_is_no_checkpoint_is_refused_before_any_trial(tiny_world, tmp_path):
    """Deterministic: the sweep fails once, before Ray starts, naming the file (it used to
    fail inside the trial, retried)."""
    bad = tmp_path / "not-bert.safetensors"
    bad.write_bytes(b"this is not a checkpoint")
    found = problems(tiny_world, tmp_path, "space.init=[random,text]",
                     f"model.text_init=bert:{bad}", "sweep.include=[text-init]")
    assert "not-bert.safetensors" in found["pretrain.model.init_path"]
