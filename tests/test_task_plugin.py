"""Adding a pretraining task touches one file: a task defined here, in the test module, is
registered and runs end to end — its masking in the pipeline, its head and loss in a model of
a family that accepts it, that family's task list, the config checks and a sweep point —
without any other module knowing its name. It is unregistered after each test."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeline_world import C, D, write_source
from vlp.contract import batch_spec as K
from vlp.tasks import Task, get_task, register, task_label, task_names, unregister
from vlp.tasks.losses import zero_loss
from vlp.tasks.masking_visual import choose_regions, zero_regions

COUNT_TARGETS = "region_count_targets"   # the toy task's own batch key


class MaskedRegionCount(Task):
    """Toy task: zero 15% of a positive pair's regions, predict from the pooled [CLS] how many
    were zeroed (MSE over positive pairs)."""

    name, label, order = "rcount", "RCount", 50
    head_name = "rcount"
    modality = "regions"
    visual = frozenset({"regions"})
    families = frozenset({"uniter"})
    needs_pooled = True

    def mask(self, batch, rng, ctx):
        zeroed = choose_regions(batch, rng, ctx)
        zero_regions(batch, zeroed)
        batch[COUNT_TARGETS] = zeroed.sum(1).astype(np.float32)

    def build_head(self, ctx):
        return nn.Linear(ctx.hidden_size, 1)

    def compute(self, head, enc, batch):
        positive = batch[K.POSITIVE].bool()
        if not positive.any():
            return {"rcount_loss": zero_loss(enc)}
        prediction = head(enc.pooled_output).squeeze(-1).float()
        return {"rcount_loss": F.mse_loss(prediction[positive],
                                          batch[COUNT_TARGETS].float()[positive])}


@pytest.fixture
def rcount():
    register(MaskedRegionCount)
    try:
        yield get_task("rcount")
    finally:
        unregister("rcount")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("plugin_world")
    write_source(d, "coco", 40, shards=2)
    return d / "coco"


def test_the_registry_lists_it_and_the_family_that_accepts_it(rcount):
    from vlp.models import get_family
    from vlp.models.families import family_task_problem

    assert task_names()[-1] == "rcount" and task_label("rcount") == "RCount"
    assert "rcount" in get_family("uniter-tiny").tasks
    assert "rcount" not in get_family("imagebert-tiny").tasks
    assert "a task of uniter" in family_task_problem("rcount", "imagebert-tiny")
    soho = family_task_problem("rcount", "soho-tiny")
    assert "needs visual input regions; soho-tiny reads pixels" in soho


@pytest.mark.parametrize("masking", ["conditional", "joint"])
def test_pipeline_masks_it_and_the_model_trains_on_it(rcount, shards, masking):
    from vlp.datasets.batching.task_sampler import TaskSampler
    from vlp.datasets.stream.data_config import DataConfig, SourceConfig
    from vlp.datasets.stream.data_plan import plan_data
    from vlp.datasets.stream.local_stream import local_batches
    from vlp.models import create_model

    mix = {"mlm": 1.0, "rcount": 1.0}
    assert set(TaskSampler(mix, seed=0).mix) == set(mix)   # the sampler knows it
    model, spec, _ = create_model("uniter-tiny", tasks=list(mix), region_feat_dim=D,
                                  num_classes=C)
    assert set(model.heads) == {"mlm", "rcount"}
    cfg = DataConfig.for_model(spec, (SourceConfig("coco", str(shards)),), batch_units=800,
                               bucket_window=128, masking=masking)
    src = local_batches(plan_data(cfg, mix, model=spec))
    try:
        batch = src.next("rcount")
    finally:
        src.close()
    zeroed = batch[K.REGION_ZEROED]
    assert zeroed.any() and torch.equal(batch[COUNT_TARGETS], zeroed.sum(1).float())
    assert (K.MLM_LABELS in batch) == (masking == "joint")   # joint: text masked as well
    out = model(batch, task="rcount")
    assert math.isfinite(out["loss"].item()) and out["rcount_loss"].item() > 0
    out["loss"].backward()
    assert model.heads["rcount"].weight.grad.abs().sum() > 0


def test_config_checks_and_a_sweep_point_take_it(rcount, tiny_world):
    from vlp.platform.pretrain.data import check_model_and_tasks
    from vlp.platform.sweep import SearchSpace, TrialPoint, check_space, load_sweep_config
    from vlp.platform.sweep.trial_configs import pretrain_config

    space = SearchSpace(tasks=["rcount", "mlm"], ratios=[1, 2], no_pretraining=False)
    assert space.ordered_tasks() == ["mlm", "rcount"]
    assert check_space(space, "uniter-tiny") == []
    (key, problem), = check_space(space, "soho-tiny")
    assert key == "space.tasks.0" and "'rcount' does not apply to soho-tiny" in problem
    point = TrialPoint.of({"rcount": 1, "mlm": 2})
    assert point.mix_label() == "MLM+RCount" and space.problems_with(point, "p") == []
    sweep = load_sweep_config(data={"world": str(tiny_world), "model": {"family": "uniter-tiny"},
                                    "pretrain": {"train": {"steps": 4},
                                                 "optimizer": {"warmup_steps": 1}}})
    cfg = pretrain_config(sweep, point, trial="t001", trial_dir="/tmp/unused")
    assert cfg.tasks == {"mlm": 2.0, "rcount": 1.0}
    check_model_and_tasks(cfg)   # the family accepts it: no ConfigError


def test_unregister_restores_the_registry_and_bad_specs_are_refused():
    from vlp.models import get_family

    before = get_family("uniter-tiny").tasks
    register(MaskedRegionCount)
    with pytest.raises(ValueError, match="already registered"):
        register(MaskedRegionCount)
    unregister("rcount")
    assert get_family("uniter-tiny").tasks == before and "rcount" not in task_names()

    class NoMask(MaskedRegionCount):
        name = "rcount-nomask"
        mask = Task.mask

    with pytest.raises(ValueError, match="does not override mask"):
        register(NoMask)

    class NoLabel(Task):
        name, head_name, modality, visual = "nolabel", "x", None, frozenset({"regions"})

    with pytest.raises(TypeError, match="does not set label"):
        register(NoLabel)
    assert "rcount-nomask" not in task_names() and "nolabel" not in task_names()


def test_builtin_tasks_keep_the_lists_they_replaced():
    """What the task files declare gives back the lists that used to be kept apart (family
    task tuples, TASK_ORDER/TASK_LABELS, REGION_TASKS)."""
    from vlp.models import FAMILIES

    kinds = {"uniter": {"mlm", "itm", "mrfr", "mrc", "mrc-kl", "wra", "mlm-obj"},
             "imagebert": {"mlm", "itm", "moc", "mrfr", "mlm-obj"},
             "vlbert": {"mlm", "itm", "mrc-vlbert", "mlm-obj", "sirp", "mlm-text"},
             "soho": {"mlm", "itm", "mvm", "mlm-obj"}}
    assert {name: set(f.tasks) for name, f in FAMILIES.items()} == {
        name: kinds[name.split("-")[0]] for name in FAMILIES}
    assert task_names() == ["mlm", "itm", "mrc", "mrc-kl", "mrfr", "moc", "mrc-vlbert", "mvm",
                            "wra", "mlm-obj", "sirp", "mlm-text"]
    assert [task_label(t) for t in task_names()] == [
        "MLM", "ITM", "MRC", "MRC-kl", "MRFR", "MOC", "MRC-VLBERT", "MVM", "WRA", "MLM-obj",
        "SIRP", "MLM-text"]
    assert {t for t in task_names() if get_task(t).modality == "regions"} == {
        "mrfr", "mrc", "mrc-kl", "moc", "mrc-vlbert"}
    assert {t for t in task_names() if get_task(t).itm_negatives} == {"itm", "wra", "sirp"}
    heads = {t: get_task(t).head_name for t in task_names()}
    assert heads["mrc"] == heads["mrc-kl"] == "region_classifier" and heads["wra"] == "itm"
    assert heads["mlm-obj"] == heads["mlm-text"] == "mlm"
    assert [t for t in task_names() if get_task(t).masks_visual_tokens] == ["mvm"]
