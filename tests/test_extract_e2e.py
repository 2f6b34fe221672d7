"""From a folder of images and a caption file to a pretrained and finetuned model: rendered
scenes written as JPEG/PNG files → `vlp data extract` (Ray Data, one actor: the
2-actor pools are test_extract_job.py's and test_extract_cluster.py's) → `vlp data import
karpathy` (+ retrieval tables) → `vlp pretrain` → `vlp finetune`, all through the CLI."""

from __future__ import annotations

import io
import json

import yaml
from PIL import Image

SPLITS = ["train"] * 12 + ["val"] * 4 + ["test"] * 4


def _images_and_captions(world, folder):
    """The tiny world's rendered scenes as image files, and their captions as Karpathy JSON."""
    import pyarrow.parquet as pq
    folder.mkdir()
    table = pq.read_table(world / "images" / "coco" / "train-00000.parquet",
                          columns=["pixels", "captions"])
    images = []
    for n, (blob, caps) in enumerate(zip(table.column("pixels").to_pylist(),
                                         table.column("captions").to_pylist()), 1):
        if len(images) == len(SPLITS):
            break
        with Image.open(io.BytesIO(blob)) as im:
            if n % 2:   # COCO's file names (id 7 ↔ COCO_train2014_000000000007.jpg) and PNGs
                name = f"COCO_train2014_{n:012d}.jpg"
                im.convert("RGB").save(folder / name, quality=95)
            else:
                name = f"{n:012d}.png"
                im.save(folder / name)
        split = SPLITS[len(images)]
        images.append({"filename": name, "cocoid": n, "split": split, "imgid": n,
                       "sentences": [{"raw": c, "sentid": n * 10 + k, "imgid": n}
                                     for k, c in enumerate(caps[:3])]})
    caption_file = folder.parent / "dataset_coco.json"
    caption_file.write_text(json.dumps({"dataset": "coco", "images": images}))
    return caption_file


def test_images_to_pretrained_and_finetuned_model(ray_local, tiny_world, tmp_path, capsys):
    from vlp.cli import main
    from vlp.datasets.storage.world import load_manifest

    imgs = tmp_path / "imgs"
    captions = _images_and_captions(tiny_world, imgs)
    out = tmp_path / "world"
    assert main(["data", "extract", "--images", str(imgs), "--model", "grid-tiny",
                 "--source", "downstream", "--out", str(out), "--grid", "4",
                 "--short-side", "64", "--long-side", "96", "--workers", "1",
                 "--batch-size", "4"]) == 0
    assert f"{len(SPLITS)} images written" in capsys.readouterr().out

    # command two: the captions bind to the extracted ids (and set each image's split)
    assert main(["data", "import", "karpathy", str(captions), "--source", "downstream",
                 "--out", str(out)]) == 0
    for split in ("train", "val"):
        assert main(["data", "import", "karpathy-retrieval", str(captions), "--split", split,
                     "--name", split, "--images", str(out / "images" / "downstream"),
                     "--out", str(out)]) == 0
    assert main(["data", "validate", str(out)]) == 0
    world = load_manifest(out)
    assert world.sources["downstream"].splits == {"train": 12, "val": 4, "test": 4}
    assert world.sources["downstream"].pairs == 3 * len(SPLITS)

    cfg = yaml.safe_load(open("jobs/configs/pretrain-tiny.yaml"))
    cfg["data"]["sources"] = {"coco": {"path": str(out / "images" / "downstream")}}
    cfg["tasks"] = {"itm": 1, "mlm": 1, "mrfr": 1}   # grid features have no soft labels
    cfg["scaling"]["num_workers"] = 1
    cfg["optimizer"]["warmup_steps"] = 1
    cfg_file = tmp_path / "pretrain.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    assert main(["pretrain", "--config", str(cfg_file), "--steps", "3", "--name", "pre",
                 "--output-dir", str(runs), "--no-mlflow"]) == 0
    assert main(["finetune", "--world", str(out), "--checkpoint", str(runs / "pre"),
                 "--benchmarks", "retrieval", "--output-dir", str(runs), "--no-mlflow",
                 "--set", "settings.retrieval.steps=3"]) == 0
    text = capsys.readouterr().out
    assert "retrieval" in text
