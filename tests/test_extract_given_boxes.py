"""`vlp data extract --boxes` (issue 39): the detector featurises given boxes (MAttNet's
detections for RefCOCO+ val^d) with its own RoI pooling and head, no RPN, NMS or filter; the
boxes are written as given; bad boxes are refused before Ray starts (or, when only the
image's size tells, as that image's failure); and the route MAttNet json → import → extract
→ RefCOCO+ with ``detections: mattnet`` runs end to end."""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from vlp.models.vision.detection.butd import build_butd
from butd_images import SETTINGS, synthetic_image as _image
from vlp.models.vision.extractors.base import ExtractSettings

torch.set_num_threads(1)



def _extract(extractor, images, boxes=None):
    prepared = [extractor.prepare(im) for im in images]
    kw = {} if boxes is None else {"boxes": boxes}
    return extractor.extract([torch.from_numpy(x.copy()) for x, _ in prepared],
                             [s for _, s in prepared], [im.shape[:2] for im in images], **kw)


@pytest.mark.parametrize("pooler", ["roi_pool", "roi_align"])
def test_a_given_box_gets_the_features_the_model_gives_it_when_it_proposes_it(pooler):
    """Images resized by 0.8, 0.96 and 1.5 (so the given boxes must be scaled as the model's
    own are): the model's own regions, given back in reverse order, get the same features,
    soft labels and whole-image feature, and are written exactly as given, in that order."""
    torch.manual_seed(0)
    extractor = build_butd(None, SETTINGS, size="tiny")
    extractor.detector.roi_heads.cfg = replace(extractor.detector.cfg, pooler=pooler)
    images = [_image(120, 180, 0), _image(200, 90, 1), _image(64, 64, 2)]
    own = _extract(extractor, images)
    given = [r["boxes"][::-1].copy() for r in own]
    again = _extract(extractor, images, given)
    for o, g, b in zip(own, again, given):
        np.testing.assert_array_equal(g["boxes"], b)
        np.testing.assert_allclose(g["features"].astype(np.float32),
                                   o["features"][::-1].astype(np.float32), rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(g["soft_labels"], o["soft_labels"][::-1], atol=1e-5)
        np.testing.assert_array_equal(g["image_feature"], o["image_feature"])
        # the confidence without NMS: the highest object-class probability
        np.testing.assert_allclose(g["confidences"], g["soft_labels"][:, 1:].max(1), rtol=1e-6)
        assert g["features"].dtype == np.float16 and g["boxes"].dtype == np.float32
    # not a copy of the own run: other boxes get other features
    shifted = [np.clip(b + [7, 5, 7, 5], 0, None).astype(np.float32) for b in given]
    moved = _extract(extractor, images, shifted)
    assert not np.allclose(moved[0]["features"].astype(np.float32),
                           again[0]["features"].astype(np.float32), atol=1e-3)


def test_every_given_box_is_kept_however_many_and_however_weak():
    """No NMS, no confidence filter, no box limits: 3 boxes (under min_boxes), two of them the
    same box, and 30 (over max_boxes) are written as they come."""
    torch.manual_seed(0)
    extractor = build_butd(None, SETTINGS, size="tiny")
    img = _image(120, 180, 3)
    few = np.array([[0, 0, 30, 30], [0, 0, 30, 30], [10, 20, 170, 110]], np.float32)
    many = np.array([[i, i, i + 40, i + 50] for i in range(30)], np.float32)
    a, b = _extract(extractor, [img, img], [few, many])
    assert a["features"].shape[0] == 3 and b["features"].shape[0] == 30
    np.testing.assert_array_equal(a["features"][0], a["features"][1])
    np.testing.assert_array_equal(b["boxes"], many)


# ---- the job's checks, before Ray -------------------------------------------------------

def _write_images(folder, sizes: dict[str, tuple[int, int]]):
    folder.mkdir(parents=True, exist_ok=True)
    for n, (name, (h, w)) in enumerate(sizes.items()):
        Image.fromarray(_image(h, w, n)).save(folder / f"{name}.png")
    return folder


def _boxes_file(path, rows: list[tuple], nested: bool = False):
    ids = [r[0] for r in rows]
    boxes = [None if r[1] is None else (r[1] if nested else [x for b in r[1] for x in b])
             for r in rows]
    kind = pa.list_(pa.list_(pa.float64())) if nested else pa.list_(pa.float32())
    pq.write_table(pa.table({"image_id": pa.array(ids), "boxes": pa.array(boxes, kind)}), path)
    return str(path)


def _options(imgs, out, boxes, model="butd-tiny", **kw):
    from vlp.platform.extract.extract_job import ExtractOptions
    return ExtractOptions(images=str(imgs), image_list=None, model=model, weights="random",
                          source="downstream", split="val", out=str(out), boxes=boxes,
                          settings=ExtractSettings(short_side=96, long_side=160,
                                                   grid=4, min_boxes=1), **kw)


def test_the_plan_reads_the_boxes_and_records_them(tmp_path):
    from vlp.platform.extract.extract_job import plan

    imgs = _write_images(tmp_path / "imgs", {"COCO_train2014_000000000007": (80, 120),
                                             "12": (90, 60)})
    f = _boxes_file(tmp_path / "b.parquet", [(7, [[1, 2, 30, 40]]),
                                             (12, [[0, 0, 60, 90], [5, 5, 6, 6]]),
                                             (99, [[0, 0, 1, 1]])], nested=True)
    p = plan(_options(imgs, tmp_path / "out", f))
    assert p.given.boxes["7"].tolist() == [[1, 2, 30, 40]]      # COCO's ids, as the files'
    assert sorted(r.image_id for r in p.todo) == ["12", "7"]
    assert p.metadata["given_boxes"].startswith(f"{f} sha256=")
    assert "on given boxes" in p.describe() and "3 images, 4 boxes" in p.describe()


@pytest.mark.parametrize("rows,expected", [
    ([("a", [[5, 5, 5, 9]])], "row 0 (image 'a'): box 0 [5, 5, 5, 9] is degenerate"),
    ([("a", [[1, 1, 9, 9], [9, 9, 3, 12]])], "row 0 (image 'a'): box 1 [9, 9, 3, 12] is "
                                             "degenerate"),
    ([("a", [[-4, 1, 9, 9]])], "box 0 [-4, 1, 9, 9] lies outside the image"),
    ([("a", [[1, float("nan"), 9, 9]])], "box 0 [1, nan, 9, 9]: expected finite numbers"),
    ([("a", [[1, 1, 9, 9]]), ("a", [[1, 1, 9, 9]])], "row 1: image 'a' again (first at row 0)"),
])
def test_a_bad_box_is_one_line_naming_file_row_image_and_box(tmp_path, rows, expected):
    from vlp.platform.extract.extract_job import plan

    imgs = _write_images(tmp_path / "imgs", {"a": (80, 120)})
    f = _boxes_file(tmp_path / "b.parquet", rows)
    with pytest.raises(ValueError) as e:
        plan(_options(imgs, tmp_path / "out", f))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{f}: ") and expected in msg
    assert not (tmp_path / "out").exists()                  # nothing written


def test_refusals_before_ray(tmp_path):
    from vlp.platform.extract.extract_job import plan

    imgs = _write_images(tmp_path / "imgs", {"a": (80, 120), "b": (80, 120)})
    f = _boxes_file(tmp_path / "b.parquet", [("a", [[1, 1, 9, 9]]), ("b", None)])
    with pytest.raises(ValueError, match=r"^--boxes .*: 1 of 2 images to extract have no "
                                         r"given boxes \(e\.g\. image 'b', .*b\.png\)"):
        plan(_options(imgs, tmp_path / "out", f))
    with pytest.raises(ValueError, match="grid-tiny cannot take given boxes .* butd-r101-c4, "
                                         "butd-tiny$"):
        plan(_options(imgs, tmp_path / "out", f, model="grid-tiny"))
    with pytest.raises(ValueError, match="has no MAttNet detections for refcoco\\+ \\(import "
                                         "them first: vlp data import mattnet-dets"):
        plan(_options(imgs, tmp_path / "out", "mattnet:refcoco+"))
    with pytest.raises(ValueError, match="unknown MAttNet dataset 'refclef'"):
        plan(_options(imgs, tmp_path / "out", "mattnet:refclef"))
    (tmp_path / "notes.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="notes.parquet is not a Parquet file"):
        plan(_options(imgs, tmp_path / "out", str(tmp_path / "notes.parquet")))
    pq.write_table(pa.table({"image": ["a"]}), tmp_path / "cols.parquet")
    with pytest.raises(ValueError, match="cols.parquet: no column 'image_id'"):
        plan(_options(imgs, tmp_path / "out", str(tmp_path / "cols.parquet")))


def test_a_box_past_the_images_edge_fails_that_image_alone_naming_the_box(tmp_path):
    """The image's size is known once decoded: the decode stage (run here as Ray runs it,
    on a batch) makes that image's error row; the other image goes on."""
    from vlp.platform.extract.decode_stage import PrepareImages

    imgs = _write_images(tmp_path / "imgs", {"a": (80, 120), "b": (80, 120)})
    inside = np.array([[0, 0, 121, 81]], "<f4").tobytes()          # the format's 1 px
    past = np.array([[1, 1, 9, 9], [100, 10, 130, 20]], "<f4").tobytes()
    batch = {"image_id": np.array(["a", "b"], object),
             "location": np.array([str(imgs / "a.png"), str(imgs / "b.png")], object),
             "given_boxes": np.array([inside, past], object)}
    out = PrepareImages("butd-tiny", SETTINGS)(batch)
    assert list(out["error"]) == ["", "given box 1 [100, 10, 130, 20] lies outside the 120x80 "
                                      "image (1 of 2 boxes do)"]
    assert list(out["given_boxes"]) == [inside, past]


# ---- MAttNet's detections → vlp features → RefCOCO+ val^d, through the CLI ---------------

class Oracle(torch.nn.Module):
    """Scores each region by its IoU with the expression's target box (read from the table):
    100 when the right box is among the regions."""

    def __init__(self, data):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))     # EvalRunner reads the dtype
        self.data = data

    def predict(self, batch):
        from vlp.benchmarks.refcoco_plus import box_iou
        from vlp.contract import batch_spec as K
        from vlp.contract import downstream_keys as D

        mask = batch[K.REGION_MASK].bool().numpy()
        out = np.full(mask.shape, -1e4, np.float32)
        for row, k in enumerate(batch[D.EXAMPLE_INDEX].tolist()):
            boxes = self.data.region_boxes(k)
            out[row, :len(boxes)] = box_iou(boxes, self.data.target_boxes[k])
        return torch.from_numpy(out)


def _refexp_world(tiny_world, tmp_path):
    """The tiny world with its task tables and no image features: its downstream images are
    extracted below, on MAttNet's boxes."""
    from vlp.datasets.importers.data_folder import update_world

    out = tmp_path / "world"
    shutil.copytree(tiny_world, out)
    shutil.rmtree(out / "images")
    shutil.rmtree(out / "features")

    def change(world) -> None:
        world.sources.clear()
        world.sidecars.pop("gt_box_features", None)
    update_world(out, change)
    return out


def test_mattnet_detections_to_refcoco_val_d(ray_local, tiny_world, tmp_path, capsys):
    from vlp.benchmarks import BenchmarkContext, get_benchmark
    from vlp.benchmarks.eval_runner import EvalRunner
    from vlp.benchmarks.refcoco_plus import BOX_NOTES
    from vlp.cli import main
    from vlp.datasets.downstream import data_config_for
    from vlp.datasets.storage.shards import list_shards, read_image_shard
    from vlp.datasets.storage.world import load_manifest
    from vlp.models import create_model

    out = _refexp_world(tiny_world, tmp_path)
    # the val images as files, and a MAttNet-format file: per image its objects' boxes (the
    # table's gt boxes, in file order) and a detection of the image's top-left quarter
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    table = pq.read_table(tiny_world / "images/downstream/val-00000.parquet",
                          columns=["image_id", "pixels"]).to_pylist()
    for r in table:
        Image.open(io.BytesIO(r["pixels"])).convert("RGB").save(imgs / f"{r['image_id']}.png")
    dets, want = [], {}
    for r in pq.read_table(tiny_world / "tasks/refexp/val.parquet").to_pylist():
        boxes = np.asarray(r["gt_boxes"], np.float32).reshape(-1, 4).tolist() + [[0, 0, 32, 32]]
        if r["image_id"] in want:
            continue
        want[r["image_id"]] = np.asarray(boxes, np.float32)
        for x1, y1, x2, y2 in boxes:
            dets.append({"det_id": len(dets), "h5_id": len(dets), "image_id": r["image_id"],
                         "category_id": 1, "box": [x1, y1, x2 - x1, y2 - y1], "score": 0.9})
    src = tmp_path / "refcoco+_unc" / "res101_coco_minus_refer_notime_dets.json"
    src.parent.mkdir()
    src.write_text(json.dumps(dets))
    assert main(["data", "import", "mattnet-dets", str(src), "--out", str(out)]) == 0
    listing = tmp_path / "refcoco_images.txt"           # only the images MAttNet has boxes for
    listing.write_text("".join(f"{imgs / i}.png\n" for i in want))

    # the 64×64 images resized ×1.5: the given boxes are scaled as the model's own
    assert main(["data", "extract", "--image-list", str(listing), "--model", "butd-tiny",
                 "--source", "downstream", "--split", "val", "--out", str(out),
                 "--boxes", "mattnet:refcoco+", "--short-side", "96", "--long-side", "160",
                 "--workers", "1", "--batch-size", "4"]) == 0
    printed = capsys.readouterr().out
    assert "on given boxes mattnet:refcoco+" in printed
    assert f"{len(want)} images written" in printed

    # each image's boxes as MAttNet gave them: order, count, coordinates
    got = {}
    for f in list_shards(out / "images" / "downstream"):
        shard, _ = read_image_shard(f)
        for r in shard.to_pylist():
            got[r["image_id"]] = np.asarray(r["boxes"], np.float32).reshape(-1, 4)
        meta = pq.read_schema(f).metadata
        assert meta[b"vlp.given_boxes"].startswith(b"mattnet:refcoco+ sha256=")
    assert got.keys() == want.keys()
    for image_id, boxes in want.items():
        np.testing.assert_array_equal(got[image_id], boxes)

    # RefCOCO+ with detections: mattnet accepts the shards and labels its figure mattnet
    world = load_manifest(out)
    base, spec, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=world.feature_dim)
    bench = get_benchmark("refcoco+")
    options = bench.options({"detections": "mattnet"})
    ctx = BenchmarkContext(data_config_for(spec, str(out)), options, base.family, "val", 0)
    bench.check(ctx)
    data = bench.eval_data(ctx)                    # check_mattnet_regions, image by image
    assert data.boxes_label == "mattnet"
    result = bench.evaluate(ctx, data, EvalRunner(Oracle(data), batch_size=7))
    assert result.metrics["refcocoplus_acc"] == 100.0
    assert result.notes["boxes"] == BOX_NOTES["mattnet"]
    assert bench.protocol(options) == "softmax,boxes=mattnet"

    # other boxes into the same source would mix two box sets: refused before Ray
    other = _boxes_file(tmp_path / "other.parquet", [(i, [[1, 1, 9, 9]]) for i in want])
    assert main(["data", "extract", "--image-list", str(listing), "--model", "butd-tiny",
                 "--source", "downstream", "--split", "val", "--out", str(out),
                 "--boxes", other, "--short-side", "96", "--long-side", "160",
                 "--check"]) == 2
    assert "given_boxes mattnet:refcoco+ sha256=" in capsys.readouterr().err
