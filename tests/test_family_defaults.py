"""A family run or sweep without its recipe gets its own paper's defaults, not UNITER's
(issue 39, item 6): the optimizer keys a config leaves out, and the region selection in
pretraining and finetuning. Values written from the papers here, not read from the code."""

from __future__ import annotations

import pytest

from vlp.datasets.downstream import data_config_for
from vlp.datasets.stream.data_config import DataConfig, RegionConfig, SourceConfig
from vlp.datasets.stream.data_config import family_kind
from vlp.models import FAMILIES, create_model
from vlp.platform.pretrain.experiment_config import load_experiment_config

# family → (lr, betas, weight decay, warm-up, schedule) when the config sets none of them
PAPER_OPTIMIZER = {
    "uniter-base": (5e-5, (0.9, 0.98), 0.01, 10_000, "linear"),    # reference code's recipe
    "vlbert-base": (1e-4, (0.9, 0.999), 1e-4, 8_000, "linear"),    # VL-BERT §4.1
    "imagebert-base": (1e-4, (0.9, 0.999), 0.01, 5_000, "linear"),  # §5.1 (Adam, lr 1e-4)
    "soho-r18-l3": (1e-4, (0.9, 0.999), 0.01, 0, "linear"),        # SOHO §4.1
}
# family → its paper's RoIs: (conf threshold, min, max, fixed)
PAPER_REGIONS = {
    "uniter-tiny": (0.2, 10, 100, None),        # the reference code's BUTD selection
    "vlbert-tiny": (0.5, 10, 100, None),        # VL-BERT §4.1
    "imagebert-tiny": (0.2, 10, 100, 100),      # ImageBERT §5.3: the top 100 by confidence
}


def base(family: str) -> dict:
    return {"model": {"family": family}, "train": {"steps": 20_000},
            "data": {"sources": {"a": {"path": "x"}}}}


def test_every_family_name_starts_with_its_kind():
    for name, family in FAMILIES.items():
        assert family_kind(name) == family.visual.kind, name


@pytest.mark.parametrize("family", PAPER_OPTIMIZER)
def test_the_optimizer_a_config_leaves_out_is_the_familys_papers(family):
    o = load_experiment_config(data=base(family)).optimizer
    assert (o.lr, o.betas, o.weight_decay, o.warmup_steps, o.schedule) == \
        PAPER_OPTIMIZER[family]


def test_what_a_config_sets_wins_key_by_key():
    cfg = base("vlbert-base")
    cfg["optimizer"] = {"lr": 3e-4}
    o = load_experiment_config(data=cfg).optimizer
    assert (o.lr, o.warmup_steps, o.betas) == (3e-4, 8_000, (0.9, 0.999))
    o = load_experiment_config(data=base("vlbert-base"),
                               overrides=["optimizer.warmup_steps=100"]).optimizer
    assert (o.lr, o.warmup_steps) == (1e-4, 100)


@pytest.mark.parametrize("family", PAPER_REGIONS)
def test_pretraining_and_finetuning_select_the_familys_regions(family, tiny_world):
    _, spec, _ = create_model(family, ["mlm"], region_feat_dim=64)
    want = PAPER_REGIONS[family]
    source = (SourceConfig("coco", str(tiny_world / "images" / "coco")),)
    for regions in (DataConfig.for_model(spec, source).regions,
                    data_config_for(spec, str(tiny_world)).regions):
        assert (regions.conf_threshold, regions.min_regions, regions.max_regions,
                regions.fixed_regions) == want
    given = RegionConfig(fixed_regions=36)
    assert DataConfig.for_model(spec, source, regions=given).regions == given


def test_the_experiment_leaves_regions_to_the_family_unless_set(tiny_world):
    from vlp.platform.pretrain.data import stage_data_config

    cfg = load_experiment_config(data=base("vlbert-tiny"))
    assert cfg.data.regions is None
    _, spec, _ = create_model("vlbert-tiny", ["mlm"], region_feat_dim=64)
    assert stage_data_config(cfg, cfg.stage_plan()[0], spec).regions.conf_threshold == 0.5
    cfg = load_experiment_config(data=base("vlbert-tiny"),
                                 overrides=["data.regions.conf_threshold=0.3"])
    assert stage_data_config(cfg, cfg.stage_plan()[0], spec).regions.conf_threshold == 0.3


def test_a_pairs_budget_caps_the_examples_beside_the_units():
    """data.batch_examples (VL-BERT's 256 pairs): short rows no longer fill a units budget
    with 2-3× the paper's pairs."""
    import numpy as np

    from vlp.datasets.batching.length_buckets import bucket_batches

    rng = np.random.default_rng(0)
    T, V = rng.integers(8, 16, 1000), rng.integers(10, 40, 1000)    # ~40 units a pair
    units_only, _ = bucket_batches(T, V, 4096, np.random.default_rng(1))
    capped, _ = bucket_batches(T, V, 4096, np.random.default_rng(1), max_examples=32)
    assert max(len(b) for b in units_only) > 64                      # the units alone: > 2×
    assert max(len(b) for b in capped) == 32
    assert sorted(np.concatenate(capped).tolist()) == list(range(1000))   # every pair once


def test_a_pixel_family_pretrains_without_regions(tiny_world):
    """SOHO reads pixels: the experiment's regions: null must not reach its DataConfig."""
    from vlp.platform.pretrain.data import stage_data_config

    cfg = load_experiment_config(data=base("soho-tiny"))
    _, spec, _ = create_model("soho-tiny", ["mlm"])
    assert stage_data_config(cfg, cfg.stage_plan()[0], spec).visual == "pixels"
