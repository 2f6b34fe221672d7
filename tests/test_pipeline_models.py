"""The synthetic world through the pipeline into the real models of every family: each task's
batch is accepted and gives a finite loss (the batch contract, end to end)."""

from __future__ import annotations

import math

import pytest
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.stream.data_config import DataConfig, PixelConfig, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches

FAMILY_TASKS = {
    "uniter-tiny": ["mlm", "itm", "mrfr", "mrc", "mrc-kl", "wra"],
    "imagebert-tiny": ["mlm", "itm", "moc", "mrfr"],
    "vlbert-tiny": ["mlm", "itm", "mrc-vlbert"],
    "soho-tiny": ["mlm", "itm", "mvm"],
}


def sources(world, names=("coco", "vg", "cc", "sbu")):
    return tuple(SourceConfig(n, str(world / "images" / n)) for n in names)


@pytest.mark.parametrize("family, masking", [(f, "conditional") for f in FAMILY_TASKS]
                         + [("uniter-tiny", "joint"), ("soho-tiny", "joint")])
def test_world_batches_feed_the_models(tiny_world, family, masking):
    from vlp.models.factory import create_model

    tasks = FAMILY_TASKS[family]
    # the tiny world: D = 64, C = 17 (its manifest); plan_data checks them against the model
    model, spec, _ = create_model(family, tasks=tasks, region_feat_dim=64, num_classes=17)
    overrides = dict(batch_units=512, bucket_window=64, masking=masking)   # small: fast CPU
    if spec.input_kind == "pixels":
        overrides["pixels"] = PixelConfig(shorter_side=64, longer_max=64)
        overrides["batch_units"] = 400
    cfg = DataConfig.for_model(spec, sources(tiny_world), **overrides)
    plan = plan_data(cfg, tasks, model=spec)
    model.eval()
    src = local_batches(plan)
    for task in tasks:
        batch = src.next(task)
        assert int(batch[K.INPUT_UNITS]) <= cfg.batch_units
        with torch.no_grad():
            out = model(batch, task=task)
        assert math.isfinite(float(out["loss"])), (family, task, out)
    src.close()


def test_model_mismatch_is_a_clear_error(tiny_world):
    from vlp.datasets.stream.data_config import DataConfigError
    from vlp.models.factory import create_model

    probe = create_model("uniter-tiny", tasks=["mlm"], region_feat_dim=2048).preprocess
    cfg = DataConfig.for_model(probe, sources(tiny_world, ("coco",)))
    with pytest.raises(DataConfigError, match="64.*expects 2048-d"):
        plan_data(cfg, ["mlm"], model=probe)
