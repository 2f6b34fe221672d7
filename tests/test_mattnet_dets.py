"""MAttNet's RefCOCO+ detections (issue 39): the public dets json imported as the detected
boxes, the RefCOCO+ benchmark scoring them only when the image source's regions are those
boxes, and every detected-box figure labelled mattnet or shard-regions."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from vlp.datasets.downstream import DownstreamDataError
from vlp.datasets.importers import InputFormatError, run_import
from vlp.datasets.storage.world import load_manifest
from vlp.platform.finetune.finetune_config import load_finetune_config

# the public format: a list of detections, box = [x, y, w, h] pixels (MAttNet's
# res101_coco_minus_refer_notime_dets.json; entries written by hand)
DETS = [
    {"det_id": 7, "h5_id": 0, "image_id": 581857, "category_id": 1, "category_name": "person",
     "box": [103.9, 20.5, 50.0, 120.25], "score": 0.98},
    {"det_id": 8, "h5_id": 1, "image_id": 581857, "category_id": 62, "category_name": "chair",
     "box": [0, 0, 10, 10], "score": 0.51},
    {"det_id": 9, "h5_id": 2, "image_id": 12, "category_id": 3, "category_name": "car",
     "box": [5, 6, 7, 8], "score": 0.7},
    {"image_id": 12, "box": [1, 2, 3, 4]},          # det_id, score, category may be missing
]


@pytest.fixture
def world(tiny_world, tmp_path):
    out = tmp_path / "world"
    shutil.copytree(tiny_world, out)
    return out


def write(path, doc):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_import_writes_each_images_boxes_in_pixels(world, tmp_path):
    src = write(tmp_path / "refcoco+_unc" / "res101_coco_minus_refer_notime_dets.json", DETS)
    report = run_import("mattnet-dets", [src], world)     # dataset from MAttNet's folder name
    assert report.counts == {"images": 2, "detections": 4}
    manifest = load_manifest(world)
    rel = manifest.sidecars["mattnet_dets.refcoco+"]
    assert rel == "detections/refcoco+_mattnet.parquet"
    rows = {r["image_id"]: r for r in pq.read_table(world / rel).to_pylist()}
    assert sorted(rows) == ["12", "581857"]
    np.testing.assert_allclose(rows["581857"]["boxes"], [103.9, 20.5, 153.9, 140.75,
                                                        0, 0, 10, 10], rtol=1e-6)
    np.testing.assert_allclose(rows["12"]["boxes"], [5, 6, 12, 14, 1, 2, 4, 6])
    assert rows["12"]["det_ids"] == [9, -1] and rows["12"]["category_ids"] == [3, -1]
    assert rows["12"]["scores"][0] == pytest.approx(0.7) and math.isnan(rows["12"]["scores"][1])
    log = [json.loads(x) for x in (world / "meta" / "imports.jsonl").read_text().splitlines()]
    assert log[-1]["importer"] == "mattnet-dets" and log[-1]["counts"]["detections"] == 4


def test_the_refer_toolkits_dets_key_and_the_dataset_option(world, tmp_path):
    src = write(tmp_path / "dets.json", {"dets": DETS[:1]})
    with pytest.raises(ValueError, match="pass --dataset"):
        run_import("mattnet-dets", [src], world)
    run_import("mattnet-dets", [src], world, dataset="refcocog")
    assert load_manifest(world).sidecars["mattnet_dets.refcocog"] == \
        "detections/refcocog_mattnet.parquet"


@pytest.mark.parametrize("entry,where,expected", [
    ({"box": [1, 2, 3, 4]}, "dets[1]", "missing field 'image_id'"),
    ({"image_id": [12], "box": [1, 2, 3, 4]}, "dets[1]", "field 'image_id' is"),
    ({"image_id": 12, "box": [1, 2, 3]}, "dets[1]", "field 'box' is [1, 2, 3]"),
    ({"image_id": 12, "box": [1, 2, -3, 4]}, "dets[1]", "non-negative size"),
    ({"image_id": 12, "box": [1, 2, 3, 4], "score": "high"}, "dets[1]", "field 'score'"),
    ({"det_id": 7, "image_id": 12, "box": [1, 2, 3, 4]}, "dets[1] (det_id 7)",
     "det_id 7 again (first at dets[0])"),
])
def test_a_bad_entry_is_one_line_naming_file_entry_and_key(world, tmp_path, entry, where,
                                                           expected):
    src = write(tmp_path / "refcoco+_unc" / "dets.json", [DETS[0], entry])
    with pytest.raises(InputFormatError) as e:
        run_import("mattnet-dets", [src], world)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{src}: {where}: ") and expected in msg
    assert not (world / "detections").exists()       # nothing half-written
    assert "mattnet_dets.refcoco+" not in load_manifest(world).sidecars


# ---- the benchmark -----------------------------------------------------------------------

def finetune(world, **options):
    return load_finetune_config(data={
        "world": str(world), "benchmarks": ["refcoco+", "refcoco+-gt"],
        "mlflow": {"enabled": False}, "model": {"family": "uniter-tiny", "init": "random"},
        "settings": {"refcoco+": {"options": options}} if options else {}})


def test_every_detected_box_figure_is_labelled(world):
    assert finetune(world).protocol_of("refcoco+")[0] == "softmax,boxes=shard-regions"
    assert finetune(world, detections="mattnet").protocol_of("refcoco+")[0] == \
        "softmax,boxes=mattnet"
    assert finetune(world).protocol_of("refcoco+-gt")[0] == "softmax"   # no detections there


def own_regions_as_dets(data_cfg, world) -> list[dict]:
    """The downstream source's regions of every refexp image, written as MAttNet entries:
    a world whose image source holds features of MAttNet's boxes."""
    from vlp.datasets.downstream.image_store import ImageStore
    from vlp.datasets.downstream.refexp import EVERY_REGION

    dets = []
    for split in ("train", "val"):
        store = ImageStore.open(data_cfg.model_copy(update={"regions": EVERY_REGION}), split)
        for image_id, row in store.row_of.items():
            for x1, y1, x2, y2 in store.region_boxes(row).tolist():
                dets.append({"det_id": len(dets), "image_id": image_id,
                             "box": [x1, y1, x2 - x1, y2 - y1], "score": 0.9})
    return dets


def test_mattnet_boxes_are_scored_only_when_the_regions_are_those_boxes(world, tmp_path):
    from vlp.benchmarks import get_benchmark
    from vlp.benchmarks.refcoco_plus import BOX_NOTES
    from vlp.datasets.downstream.refexp import RefExpData
    from vlp.platform.finetune.preflight import prepare
    from vlp.platform.finetune.run import components_for

    ft = finetune(world, detections="mattnet")
    _, _, _, options = ft.settings_for("refcoco+")
    ctx = components_for(ft, "refcoco+", prepare(ft), 4, options).ctx
    with pytest.raises(DownstreamDataError, match="no MAttNet detections for refcoco\\+ "):
        get_benchmark("refcoco+").check(ctx)            # on the driver, before any worker
    dets = own_regions_as_dets(ctx.data, world)
    src = write(tmp_path / "refcoco+_unc" / "dets.json", dets)
    run_import("mattnet-dets", [src], world)
    get_benchmark("refcoco+").check(ctx)
    data = RefExpData(ctx.data, "val", "detected", "mattnet")
    assert data.boxes_label == "mattnet" and "MAttNet's detections" in BOX_NOTES["mattnet"]
    assert RefExpData(ctx.data, "val", "detected").boxes_label == "shard-regions"
    # one box moved: that image's regions are no longer its MAttNet boxes
    moved = [dict(d) for d in dets]
    moved[0]["box"] = [b + 40 for b in moved[0]["box"]]
    write(src, moved)
    run_import("mattnet-dets", [src], world, overwrite=True)
    for split in ("train", "val"):
        try:
            RefExpData(ctx.data, split, "detected", "mattnet")
        except DownstreamDataError as e:
            msg = str(e)
            break
    else:
        raise AssertionError("a moved MAttNet box was not noticed")
    image = str(moved[0]["image_id"])
    assert "\n" not in msg and f"image {image!r} MAttNet box 0 matches no region" in msg
    assert "are not their MAttNet boxes" in msg


def test_the_sweeps_trials_and_the_leaderboard_name_the_boxes(tiny_world, tmp_path):
    from types import SimpleNamespace

    from vlp.platform.sweep.sweep_config import load_sweep_config
    from vlp.platform.sweep.tracking import protocol_tags
    from vlp.platform.tracking.leaderboard_protocols import protocol_header

    sweep = load_sweep_config("jobs/configs/sweep-tiny.yaml", [
        f"world={tiny_world}", f"sweep.output_dir={tmp_path}",
        "finetune.benchmarks=[refcoco+]"])
    tags = protocol_tags(sweep)
    assert tags["downstream_protocol"] == "refcoco+:softmax,boxes=shard-regions"
    header = protocol_header([SimpleNamespace(trial="t001", family=tags["family"],
                                              protocol=tags["downstream_protocol"])])
    assert "boxes=shard-regions" in header[0]
