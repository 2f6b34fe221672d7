"""VL-BERT's visual input of text tokens and [END]: the feature of an RoI covering the whole
image when the shard has one (the synthetic world writes one; importers keep a full-image box
they find), else the mean of the real regions with a warning naming the source; the same
whether or not a RoI is masked (issue 29)."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from pipeline_world import C, D, write_source
from vlp.contract import batch_spec as K
from vlp.datasets.stream.data_config import DataConfig, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.batching.image_block import image_key
from vlp.datasets.stream.local_stream import local_batches
from vlp.datasets.batching.task_batch import EXAMPLE_IMAGE_KEY
from vlp.datasets.storage.shards import image_table
from vlp.models import create_model

torch.set_num_threads(1)


def _stored_whole(folder) -> dict[int, np.ndarray]:
    out = {}
    for f in sorted(folder.rglob("*.parquet")):
        t = pq.read_table(f, columns=["image_id", "image_feature"])
        for iid, blob in zip(t.column("image_id").to_pylist(),
                             t.column("image_feature").to_pylist()):
            out[image_key(iid)] = None if blob is None else np.frombuffer(blob, "<f2")
    return out


def _vlbert_batches(sources, tasks=("mlm", "itm", "mrc-vlbert"), dim=64, classes=17):
    _, spec, _ = create_model("vlbert-tiny", list(tasks), region_feat_dim=dim,
                              num_classes=classes)
    cfg = DataConfig.for_model(spec, sources, batch_units=512, bucket_window=64)
    return local_batches(plan_data(cfg, list(tasks), model=spec), with_ids=True)


def test_synthetic_world_writes_the_whole_image_roi(tiny_world):
    whole = _stored_whole(tiny_world / "images" / "coco")
    assert whole and all(v is not None and v.shape == (64,) for v in whole.values())
    t = pq.read_table(next((tiny_world / "images" / "coco").rglob("*.parquet")))
    feats = np.frombuffer(t.column("features")[0].as_py(), "<f2").reshape(-1, 64)
    assert not any(np.array_equal(whole[image_key(t.column("image_id")[0].as_py())], r)
                   for r in feats)                      # its own RoI, not one of the regions


def test_region_features_do_not_change_with_the_whole_image_roi():
    """The whole-image RoI draws from streams of its own and is featurized apart: every
    region is the same bytes as a world without it (other families' inputs unchanged)."""
    from vlp.datasets.synth.detector import DetectorConfig, SimulatedDetector
    from vlp.datasets.synth.synthetic_image import add_features, make_image
    from vlp.datasets.synth.scene import IN_DOMAIN

    det = SimulatedDetector(DetectorConfig(64))
    style = IN_DOMAIN
    with_whole = [make_image(0, "coco", i, 96, style, det, pixels=False) for i in range(4)]
    without = [make_image(0, "coco", i, 96, style, det, pixels=False) for i in range(4)]
    for img in without:
        img.whole = None
    add_features(with_whole, det)
    add_features(without, det)
    for a, b in zip(with_whole, without):
        np.testing.assert_array_equal(a.detection.features, b.detection.features)
        assert a.row("coco", "train")["image_feature"].shape == (64,)


def test_vlbert_text_side_takes_the_whole_image_roi(tiny_world):
    folder = tiny_world / "images" / "coco"
    whole = _stored_whole(folder)
    src = _vlbert_batches((SourceConfig("coco", str(folder)),))
    try:
        mlm, itm, mrc = src.next("mlm"), src.next("itm"), src.next("mrc-vlbert")
    finally:
        src.close()
    for batch in (mlm, itm, mrc):   # ITM negatives: the donor image's RoI comes with its
        # regions; masked RoIs or not, every text token sees the image's stored RoI (issue 29)
        want = np.stack([whole[int(k)] for k in batch[EXAMPLE_IMAGE_KEY]]).astype(np.float32)
        np.testing.assert_allclose(batch[K.IMAGE_FEAT].numpy(), want)
    assert (itm[K.ITM_LABELS] == 0).any()
    assert mrc[K.REGION_ZEROED].bool().any(1).any()


def test_without_a_whole_image_roi_the_mean_and_a_warning_naming_the_source(tmp_path, caplog):
    write_source(tmp_path, "webalt", 24, shards=1, seed=3)      # shards: null image_feature
    src = _vlbert_batches((SourceConfig("webalt", str(tmp_path / "webalt")),), ("mlm",), D, C)
    try:
        with caplog.at_level(logging.WARNING, logger="vlp.datasets.batching.pretrain_batches"):
            batch = src.next("mlm")
            src.next("mlm")
    finally:
        src.close()
    warned = [r.getMessage() for r in caplog.records if "whole-image" in r.getMessage()]
    assert len(warned) == 1 and "webalt" in warned[0]           # once, naming the source
    use = batch[K.REGION_MASK].float().unsqueeze(-1)
    mean = (batch[K.REGION_FEATS].float() * use).sum(1) / use.sum(1)
    torch.testing.assert_close(batch[K.IMAGE_FEAT], mean)


def test_a_full_image_box_among_the_detections_lends_its_feature():
    feats = np.arange(3 * D, dtype=np.float32).reshape(3, D) / 100
    row = dict(image_id="x", source="s", split="train", width=50, height=40,
               boxes=[[5, 5, 20, 20], [0.5, 0, 50, 39.5], [0, 0, 10, 10]],
               confidences=[0.9, 0.8, 0.7], features=feats, captions=["a b"])
    t = image_table([row, {**row, "boxes": [[5, 5, 20, 20], [1, 2, 49, 40], [0, 0, 10, 10]]}],
                    D)
    got = t.column("image_feature").to_pylist()
    np.testing.assert_array_equal(np.frombuffer(got[0], "<f2"), feats[1].astype(np.float16))
    assert got[1] is None                                       # 2 px short: not the image
    assert t.column("num_boxes").to_pylist() == [3, 3]          # the box stays a region


@pytest.mark.parametrize("bad", [2, 0])
def test_shard_validation_checks_the_whole_image_feature_width(tmp_path, bad):
    from vlp.datasets.storage.shards import write_image_shard
    from vlp.datasets.storage.shard_format import ShardError

    row = dict(image_id="x", source="s", split="train", width=50, height=40,
               boxes=[[5, 5, 20, 20]], confidences=[0.9], features=np.ones((1, D)),
               captions=["a b"], image_feature=np.ones(bad))
    with pytest.raises(ShardError, match="image_feature"):
        write_image_shard(tmp_path / "x.parquet", image_table([row], D),
                          feature_extractor="t", feature_dim=D)
