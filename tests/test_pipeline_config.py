"""DataConfig and plan_data: every bad input is one clear error naming its key, raised before
any row is read."""

from __future__ import annotations

import pytest

from pipeline_world import write_source
from vlp.datasets.stream.data_config import DataConfig, DataConfigError, RegionConfig, SourceConfig
from vlp.datasets.stream.data_plan import plan_data


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("cfgworld")
    write_source(d, "coco", 12, shards=1)
    write_source(d, "cc", 12, shards=1, seed=1)
    (d / "empty").mkdir()
    return d


def cfg(world, **kw):
    sources = kw.pop("sources", (SourceConfig("coco", str(world / "coco")),))
    return DataConfig(sources=sources, **kw)


def problems_of(excinfo):
    return {k: m for k, m in excinfo.value.problems}


@pytest.mark.parametrize("kw, key", [
    (dict(mask_prob=1.5), "mask_prob"),
    (dict(itm_neg_prob=-0.1), "itm_neg_prob"),
    (dict(max_text_len=0), "max_text_len"),
    (dict(location="lxmert"), "location"),
    (dict(masking="random"), "masking"),
    (dict(overlong="cut"), "overlong"),
    (dict(batch_units=50), "batch_units"),          # cannot hold one 60-token + 100-region example
    (dict(regions=RegionConfig(min_regions=20, max_regions=10)), "regions.max_regions"),
    (dict(regions={"conf_threshold": 1.2}), "regions.conf_threshold"),
    (dict(split="dev"), "split"),
])
def test_config_errors_name_the_key(world, kw, key):
    with pytest.raises(DataConfigError) as e:
        cfg(world, **kw)
    assert key in problems_of(e), e.value.problems


def test_a_section_checks_its_own_limits_when_built():
    with pytest.raises(DataConfigError, match=r"conf_threshold: expected a finite number ≥ 0 "
                                              r"and < 1, got 1.2"):
        RegionConfig(conf_threshold=1.2)


def test_source_weight_errors(world):
    with pytest.raises(DataConfigError) as e:
        cfg(world, sources=(SourceConfig("coco", str(world / "coco"), -1.0),))
    assert "sources.coco.weight" in problems_of(e)
    with pytest.raises(DataConfigError) as e:
        cfg(world, sources=(SourceConfig("coco", str(world / "coco"), 0.0),
                            SourceConfig("cc", str(world / "cc"), 0.0)))
    assert "all source weights are 0" in problems_of(e)["sources"]


def test_from_dict_unknown_key_and_mapping_sources(world):
    c = DataConfig.from_dict({"sources": {"coco": {"path": str(world / "coco"), "weight": 2}},
                              "regions": {"fixed_regions": 36}, "max_text_len": 40})
    assert c.sources[0] == SourceConfig("coco", str(world / "coco"), 2)
    assert c.regions.fixed_regions == 36
    assert c.to_flat_dict()["sources.coco.weight"] == 2
    with pytest.raises(DataConfigError) as e:
        DataConfig.from_dict({"sources": [], "max_txt_len": 40})
    assert "did you mean 'max_text_len'" in problems_of(e)["max_txt_len"]


@pytest.fixture
def no_reading(monkeypatch):
    """Any attempt to read rows fails loudly: plan errors must come first."""
    import pyarrow.parquet as pq

    def forbidden(*a, **k):
        raise AssertionError("rows were read before the config was validated")
    monkeypatch.setattr(pq, "read_table", forbidden)


def test_plan_errors_before_reading(world, no_reading):
    c = cfg(world, sources=(SourceConfig("coco", str(world / "coco")),
                            SourceConfig("vg", str(world / "nowhere")),
                            SourceConfig("cc", str(world / "empty"))))
    with pytest.raises(DataConfigError) as e:
        plan_data(c, {"mlm": 1, "mrfr": 1})
    p = problems_of(e)
    assert "no such folder" in p["sources.vg.path"]
    assert "holds no Parquet shards" in p["sources.cc.path"]
    with pytest.raises(DataConfigError) as e:
        plan_data(cfg(world), {"mlm": 1, "mrfx": 1})
    assert "unknown task 'mrfx'" in problems_of(e)["tasks.mrfx"]
    with pytest.raises(DataConfigError) as e:
        plan_data(cfg(world), {"mlm": -2})
    assert "tasks.mlm" in problems_of(e)
    with pytest.raises(DataConfigError) as e:
        plan_data(cfg(world), {"mlm": 0, "itm": 0.0})
    assert "tasks" in problems_of(e)
    with pytest.raises(DataConfigError) as e:
        plan_data(cfg(world), {"mvm": 1})           # MVM needs pixel input
    assert "visual" in problems_of(e)["tasks.mvm"]
    with pytest.raises(DataConfigError) as e:
        plan_data(cfg(world, tokenizer_path=str(world / "nowhere")), {"mlm": 1})
    assert "tokenizer_path" in problems_of(e)


def test_soft_labels_required_by_mrc(tmp_path, no_reading):
    from vlp.datasets.storage.shards import image_table, write_image_shard
    import numpy as np
    row = dict(image_id="a", source="s", split="train", width=10, height=10,
               boxes=[[0, 0, 5, 5]], confidences=[0.9], features=np.zeros((1, 4)),
               captions=["a cube"])
    write_image_shard(tmp_path / "s" / "p.parquet", image_table([row], 4), feature_extractor="t",
                      feature_dim=4)
    c = DataConfig(sources=(SourceConfig("s", str(tmp_path / "s")),))
    plan = plan_data(c, {"mlm": 1, "mrfr": 1})      # fine without soft labels
    assert plan.feature_dim == 4 and not plan.needs_soft_labels
    with pytest.raises(DataConfigError) as e:
        plan_data(c, {"mlm": 1, "mrc-kl": 1})
    assert "soft labels" in problems_of(e)["tasks.mrc-kl"]


def test_weights_become_shares(world):
    c = cfg(world, sources=(SourceConfig("coco", str(world / "coco"), 3.0),
                            SourceConfig("cc", str(world / "cc"), 1.0)))
    plan = plan_data(c, {"mlm": 1})
    coco, cc = plan.sources
    total = coco.examples + cc.examples
    assert coco.rate * coco.examples == pytest.approx(0.75 * total)
    assert cc.rate * cc.examples == pytest.approx(0.25 * total)


def test_mlm_obj_object_words_from_config_or_world(world, tiny_world, no_reading):
    with pytest.raises(DataConfigError) as e:       # no words given, no world manifest above
        plan_data(cfg(world), {"mlm-obj": 1})
    assert "data.object_words" in problems_of(e)["object_words"]
    plan = plan_data(cfg(world, object_words=("cube", "sphere")), {"mlm-obj": 1, "itm": 1})
    assert plan.object_words == ("cube", "sphere")
    assert plan_data(cfg(world), {"mlm": 1}).object_words == ()
    inside = DataConfig(sources=(SourceConfig("coco", str(tiny_world / "images" / "coco")),))
    names = plan_data(inside, {"mlm-obj": 1}).object_words
    assert "ball" in names and "__background__" not in names and len(names) == 16

    from vlp.datasets.batching.task_batch import object_word_ids
    from vlp.datasets.stream.text_tokenizer import load_tokenizer
    tok = load_tokenizer()
    ids = object_word_ids(tok, ("Ball", "box", "traffic light"))   # two-piece names are left out
    assert sorted(ids.tolist()) == sorted(tok.tokenizer.token_to_id(w) for w in ("ball", "box"))
    with pytest.raises(DataConfigError):
        cfg(world, object_words=("ball", " "))
