"""The audit on a folder shaped like real data (imported COCO / Flickr30K / CC features,
Karpathy splits, VQA and RefCOCO+ tables on COCO images) and UNITER's exclusion rule."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest

from test_importers_fixtures import karpathy_doc, make_images, vqa_docs, write_butd_tsv, write_json
from vlp.datasets.audit.leakage import FINETUNING, PRETRAINING, audit_world
from vlp.datasets.audit.exclude import exclude_leaks
from vlp.datasets.audit.splits import benchmark_of, parse_split_roles, split_role
from vlp.datasets.importers import run_import
from vlp.datasets.storage.shards import read_image_shard, write_image_shard
from vlp.datasets.storage.task_tables import write_task_table
from vlp.datasets.storage.world import load_manifest

COCO = list(range(1, 13))     # Karpathy: 1-6 train, 7-8 restval, 9-10 val, 11-12 test
FLICKR = [1000092795, 10002456, 2248275918]      # train, val, test
CC = [0, 1, 2, 3]             # line numbers: the same numbers as COCO ids, other pictures


def _features(tmp, out, source, ids, seed):
    tsv = write_butd_tsv(tmp / f"{source}.tsv", make_images(ids, seed=seed))
    run_import("butd-tsv", [tsv], out, source=source)


def _table(out, task, name, rows, image_source="coco"):
    from vlp.datasets.storage.task_tables import TASK_SCHEMAS
    write_task_table(out / "tasks" / task / f"{name}.parquet", task,
                     pa.Table.from_pylist(rows, schema=TASK_SCHEMAS[task]),
                     extra_meta={"image_source": image_source} if image_source else None)
    raw = json.loads((out / "manifest.json").read_text())
    raw["tasks"].setdefault(task, {})[name] = f"tasks/{task}/{name}.parquet"
    (out / "manifest.json").write_text(json.dumps(raw))


def _refexp(*pairs):
    return [{"ref_id": f"r{k}", "image_id": str(i), "expression": "man on the left",
             "target_box": [1.0, 1.0, 5.0, 5.0], "gt_boxes": [1.0, 1.0, 5.0, 5.0],
             "target_gt_index": 0} for k, i in enumerate(pairs)]


@pytest.fixture(scope="module")
def real_world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    out = tmp / "data"
    _features(tmp, out, "coco", COCO, seed=1)
    _features(tmp, out, "flickr30k", FLICKR, seed=2)
    _features(tmp, out, "cc", CC, seed=3)
    splits = ["train"] * 6 + ["restval"] * 2 + ["val"] * 2 + ["test"] * 2
    run_import("karpathy", [write_json(tmp / "dataset_coco.json", karpathy_doc("coco", [
        (f"COCO_val2014_{i:012d}.jpg", i, sp, [f"a photo number {i}."])
        for i, sp in zip(COCO, splits)]))], out)
    run_import("karpathy", [write_json(tmp / "dataset_flickr30k.json", karpathy_doc(
        "flickr30k", [(f"{i}.jpg", None, sp, [f"people {k}."])
                      for k, (i, sp) in enumerate(zip(FLICKR, ["train", "val", "test"]))]))],
        out)
    tsv = tmp / "cc.tsv"
    tsv.write_text("".join(f"a web picture {i}\thttp://x/{i}.jpg\n" for i in CC))
    run_import("cc-tsv", [tsv], out)
    # VQA through its importer (records image_source=coco): train on 1, 2 and val on 9
    for subtype, items in (("train2014", [(1, 1, "q?", ["a"] * 10), (2, 2, "q?", ["b"] * 10)]),
                           ("val2014", [(3, 9, "q?", ["c"] * 10)])):
        qs, anns = vqa_docs(items, subtype)
        run_import("vqa", [write_json(tmp / f"q_{subtype}.json", qs),
                           write_json(tmp / f"a_{subtype}.json", anns)], out,
                   images=str(out / "images" / "coco"))
    # RefCOCO+ trains on image 9 — VQA's val image — and tests on 11: another benchmark
    _table(out, "refexp", "refcoco+_train", _refexp(3, 9))
    _table(out, "refexp", "refcoco+_testA", _refexp(11))
    _table(out, "retrieval", "flickr30k_test", [{"caption_id": "0", "image_id": "2248275918",
                                                 "caption": "people"}], "flickr30k")
    return out


@pytest.fixture
def world_copy(real_world, tmp_path):
    return shutil.copytree(real_world, tmp_path / "data")


def test_split_names_of_real_benchmarks():
    train = ["train", "restval", "trainval", "train2014", "refcoco+_train", "nominival"]
    evaluation = ["val", "dev", "test", "test1", "testA", "testB", "minival", "val2014",
                  "refcoco+_testA", "refcocog_val", "flickr30k_test", "test-dev", "test_std"]
    assert [split_role(s) for s in train] == ["train"] * len(train)
    assert [split_role(s) for s in evaluation] == ["eval"] * len(evaluation)
    assert split_role("extra") is None and split_role("train_val") is None
    assert split_role("extra", "vqa", {"vqa/extra": "train"}) == "train"
    assert split_role("extra", "ve", {"vqa/extra": "train", "extra": "eval"}) == "eval"
    assert benchmark_of("refexp", "refcoco+_testA") == "refexp:refcoco+"
    assert benchmark_of("refexp", "refcocog_train") == "refexp:refcocog"
    assert benchmark_of("vqa", "test-dev") == benchmark_of("vqa", "train") == "vqa"
    assert parse_split_roles(["dev2=eval"]) == {"dev2": "eval"}
    with pytest.raises(ValueError, match="TASK/SPLIT"):
        parse_split_roles(["dev2=testing"])


def test_real_shaped_folder_is_clean(real_world):
    report = audit_world(real_world)
    assert report.problems == [] and report.leaks == [] and report.ok
    ref = report.tasks["refexp"]
    assert (ref["refcoco+_testA"]["role"], ref["refcoco+_testA"]["context"]) == (
        "eval", "refexp:refcoco+")
    assert report.tasks["vqa"]["val"]["image_source"] == "coco"
    assert report.tasks["retrieval"]["flickr30k_test"]["role"] == "eval"
    # restval became train; COCO's Karpathy val/test rows are not read by pretraining
    assert report.sources["coco"]["splits"] == {"test": 2, "train": 8, "val": 2}
    # evaluation images: VQA val 9, RefCOCO+ testA 11, Flickr30K val + test
    assert report.stats["evaluation_images"] == 4


def test_eval_image_in_karpathy_train_leaks_into_pretraining(world_copy):
    # RefCOCO's evaluation images lie in COCO train2014 (UNITER, Figure 2)
    _table(world_copy, "refexp", "refcoco_testB", _refexp(4))
    report = audit_world(world_copy)
    [leak] = report.leaks
    assert (leak.kind, leak.image_id, leak.found_in, leak.matched_by) == (
        PRETRAINING, "4", "coco:train", ["image_id"])
    assert leak.evaluated_in == ["task refexp:refcoco_testB"]
    # a pipeline reading every split would also read the Karpathy val/test images
    everything = audit_world(world_copy, pretrain_split="all")
    assert {l.image_id for l in everything.leaks_of(PRETRAINING)} == {"4", "9", "11"}


def test_same_benchmark_train_and_test_is_a_finetuning_leak(world_copy):
    _table(world_copy, "refexp", "refcoco+_testB", _refexp(3))   # 3 is in refcoco+_train
    _table(world_copy, "refexp", "refcocog_val", _refexp(9))      # 9: another benchmark's
    report = audit_world(world_copy)
    [leak] = [l for l in report.leaks if l.kind == FINETUNING]
    assert (leak.image_id, leak.found_in, leak.matched_by) == (
        "3", "task refexp:refcoco+_train", ["task_reference"])
    assert {l.image_id for l in report.leaks_of(PRETRAINING)} == {"3"}


def test_numeric_ids_match_only_within_their_corpus(world_copy):
    # cc line 1 and COCO image 1 share a number, not a picture; a planted copy of the
    # Flickr30K test image under a cc line number is the same picture
    flickr, _ = read_image_shard(load_manifest(world_copy).image_files("flickr30k",
                                                                        "test")[0])
    row = flickr.filter(pa.compute.equal(flickr.column("image_id"), "2248275918"))
    m = load_manifest(world_copy)
    planted = row.set_column(0, "image_id", pa.array(["99"])).set_column(
        1, "source", pa.array(["cc"])).set_column(2, "split", pa.array(["train"]))
    rel = "images/cc/train-00099.parquet"
    write_image_shard(world_copy / rel, planted.replace_schema_metadata(None),
                      feature_extractor=m.feature_extractor, feature_dim=m.feature_dim)
    raw = json.loads((world_copy / "manifest.json").read_text())
    raw["sources"]["cc"]["files"]["train"].append(rel)
    (world_copy / "manifest.json").write_text(json.dumps(raw))
    report = audit_world(world_copy)
    [leak] = report.leaks
    assert (leak.image_id, leak.found_in, leak.found_id, leak.matched_by) == (
        "2248275918", "cc:train", "99", ["features"])
    # no table names the copy: exclusion removes it (and the shard it was alone in)
    result = exclude_leaks(world_copy, report, world_copy.parent / "clean")
    assert result.counts["cc"] == {"images_before": 5, "images_removed": 1,
                                   "images_uncaptioned": 0, "pairs_removed": 1}
    assert result.files_dropped == [rel]
    assert audit_world(world_copy.parent / "clean").ok


def test_exclude_leaks_writes_a_clean_copy(world_copy, tmp_path):
    _table(world_copy, "refexp", "refcoco_testB", _refexp(4, 5))
    report = audit_world(world_copy)
    clean = tmp_path / "clean"
    result = exclude_leaks(world_copy, report, clean)
    # the table still needs images 4 and 5: they stay, without their captions
    assert result.counts["coco"] == {"images_before": 12, "images_removed": 0,
                                     "images_uncaptioned": 2, "pairs_removed": 2}
    assert result.counts["cc"]["images_removed"] == 0
    assert [(r["image_id"], r["action"]) for r in result.removed["coco"]] == [
        ("4", "uncaptioned"), ("5", "uncaptioned")]
    assert result.removed["coco"][0]["evaluated_in"] == ["task refexp:refcoco_testB"]
    after = audit_world(clean)
    assert after.ok and after.sources["coco"]["images"] == 12
    assert after.sources["coco"]["pairs"] == 10
    m = load_manifest(clean)
    assert m.sources["coco"].pairs == 10 and m.sources["coco"].splits["train"] == 8
    assert m.sidecars["leak_exclusion"] == "meta/leak_exclusion.json"
    assert json.loads((clean / "meta/leak_exclusion.json").read_text())["counts"]["coco"][
        "images_uncaptioned"] == 2
    # the audited folder is untouched; unchanged files are hard links, not copies
    assert audit_world(world_copy).sources["coco"]["images"] == 12
    assert (clean / "images/cc/train-00000.parquet").stat().st_ino == (
        world_copy / "images/cc/train-00000.parquet").stat().st_ino
    with pytest.raises(FileExistsError):
        exclude_leaks(world_copy, report, clean)


def test_missing_pool_and_unknown_split_are_problems(world_copy):
    _table(world_copy, "vqa", "extra", [{"question_id": "9", "image_id": "1",
                                         "question": "q?", "answers": ["a"] * 10}])
    _table(world_copy, "ve", "test", [{"id": "1", "image_id": "1", "hypothesis": "h",
                                       "label": "neutral"}], image_source="nocaps")
    report = audit_world(world_copy)
    assert any("split name 'extra'" in p and "--split-role vqa/extra" in p
               for p in report.problems)
    assert any("image_source='nocaps'" in p for p in report.problems)
    fixed = audit_world(world_copy, split_roles={"vqa/extra": "train"})
    assert not any("extra" in p for p in fixed.problems)


def test_cli_exclude_leaks(world_copy, tmp_path, capsys):
    from vlp.cli import main

    _table(world_copy, "refexp", "refcoco_testB", _refexp(4))
    assert main(["data", "audit", str(world_copy)]) == 1
    assert "[pretraining] refcoco_testB image 4" in capsys.readouterr().out
    out = tmp_path / "clean"
    assert main(["data", "audit", str(world_copy), "--exclude-leaks", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "excluded evaluation images from pretraining" in printed and "coco" in printed
    assert main(["data", "audit", str(out)]) == 0
    capsys.readouterr()
    assert main(["data", "audit", str(world_copy), "--exclude-leaks"]) == 2
    assert main(["data", "audit", str(world_copy), "--split-role", "x"]) == 2
    # in place: the folder is replaced in one rename
    assert main(["data", "audit", str(world_copy), "--exclude-leaks", "--out",
                 str(world_copy), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["exclusion"]["counts"]["coco"][
        "images_uncaptioned"] == 1
    assert audit_world(world_copy).ok


def test_exclusion_on_the_synthetic_world(tiny_world, tmp_path):
    """A downstream test image copied into a pretraining corpus under a new id is removed."""
    world = shutil.copytree(tiny_world, tmp_path / "world")
    m = load_manifest(world)
    test, _ = read_image_shard(m.image_files("downstream", "test")[0])
    row = test.slice(0, 1)
    planted = row.set_column(0, "image_id", pa.array(["coco_777777"])).set_column(
        1, "source", pa.array(["coco"])).set_column(2, "split", pa.array(["train"]))
    rel = "images/coco/train-00099.parquet"
    write_image_shard(world / rel, planted.replace_schema_metadata(None),
                      feature_extractor=m.feature_extractor, feature_dim=m.feature_dim,
                      num_classes=m.num_classes)
    raw = json.loads((world / "manifest.json").read_text())
    raw["sources"]["coco"]["files"]["train"].append(rel)
    raw["sources"]["coco"]["images"] += 1
    (world / "manifest.json").write_text(json.dumps(raw))
    report = audit_world(world)
    assert [l.found_id for l in report.leaks_of(PRETRAINING)] == ["coco_777777"]
    result = exclude_leaks(world, report, tmp_path / "clean")
    assert result.counts["coco"]["images_removed"] == 1 and result.files_dropped == [rel]
    after = audit_world(tmp_path / "clean")
    assert after.ok and after.sources["coco"] == audit_world(tiny_world).sources["coco"]
