"""Task importers round-trip their public formats into valid task tables."""

from __future__ import annotations

import pytest

from test_importers_fixtures import (feature_world, karpathy_doc, refcoco_files, vcr_record,
                                     vqa_docs, write_json, write_jsonl)
from vlp.datasets.importers import InputFormatError, run_import
from vlp.datasets.storage.task_tables import read_task_table
from vlp.datasets.storage.world import load_manifest


def _table(out, task, split):
    world = load_manifest(out)
    table, info = read_task_table(world.task_file(task, split), task)
    assert world.task_rows[task][split] == table.num_rows
    return table.to_pylist(), info


def test_vqa(tmp_path):
    out = feature_world(tmp_path, "coco", [391895, 9])
    qs, anns = vqa_docs([(1, 391895, "What is he riding?", ["bike"] * 9 + ["bicycle"]),
                         (2, 9, "Is it food?", ["yes"] * 10)])
    q = write_json(tmp_path / "v2_OpenEnded_mscoco_val2014_questions.json", qs)
    a = write_json(tmp_path / "v2_mscoco_val2014_annotations.json", anns)
    run_import("vqa", [a, q], out, images=str(out / "images" / "coco"))  # any order
    rows, info = _table(out, "vqa", "val")
    assert rows[0] == {"question_id": "1", "image_id": "391895",
                       "question": "What is he riding?", "answers": ["bike"] * 9 + ["bicycle"]}
    assert info.extra["image_source"] == "coco" and info.extra["data_subtype"] == "val2014"


def test_vqa_unknown_image(tmp_path):
    out = feature_world(tmp_path, "coco", [9])
    qs, anns = vqa_docs([(1, 9, "q?", ["a"] * 10), (2, 5, "q2?", ["b"] * 10)])
    q = write_json(tmp_path / "q.json", qs)
    a = write_json(tmp_path / "a.json", anns)
    with pytest.raises(InputFormatError) as e:
        run_import("vqa", [q, a], out, images=str(out / "images" / "coco"))
    assert str(e.value).startswith(f"{q}: questions[1] (question_id 2): image '5' is not in "
                                   f"the image shards at {out}/images/coco; 1 record(s)")
    report = run_import("vqa", [q, a], out, images=str(out / "images" / "coco"),
                        allow_missing_images=True)
    assert report.counts == {"rows": 1, "dropped_rows_without_images": 1}


def test_task_import_needs_a_world(tmp_path):
    qs, anns = vqa_docs([(1, 9, "q?", ["a"] * 10)])
    with pytest.raises(FileNotFoundError, match="import image features into it first"):
        run_import("vqa", [write_json(tmp_path / "q.json", qs),
                           write_json(tmp_path / "a.json", anns)], tmp_path / "empty")


def test_nlvr2(tmp_path):
    out = feature_world(tmp_path, "nlvr2", ["dev-850-0-img0", "dev-850-0-img1"])
    recs = [{"identifier": "dev-850-0-0", "sentence": "There are two dogs.", "label": "True",
             "left_url": "http://x/l.jpg", "right_url": "http://x/r.jpg", "writer": "w"},
            {"identifier": "dev-850-0-1", "sentence": "No dogs.", "label": "False",
             "left_url": "http://x/l.jpg", "right_url": "http://x/r.jpg", "writer": "w"}]
    run_import("nlvr2", [write_jsonl(tmp_path / "dev.json", recs)], out,
               images=str(out / "images" / "nlvr2"))
    rows, _ = _table(out, "nlvr2", "val")
    assert rows[0] == {"id": "dev-850-0-0", "image_id_left": "dev-850-0-img0",
                       "image_id_right": "dev-850-0-img1", "statement": "There are two dogs.",
                       "label": True}
    assert rows[1]["label"] is False


def test_snli_ve(tmp_path):
    out = feature_world(tmp_path, "flickr30k", [2248275918])
    recs = [{"Flikr30kID": "2248275918.jpg", "pairID": "2248275918.jpg#0r1e",
             "sentence1": "A man.", "sentence2": "A person is outside.",
             "gold_label": "entailment"},
            {"Flikr30kID": "2248275918.jpg", "pairID": "2248275918.jpg#0r1c",
             "sentence1": "A man.", "sentence2": "Nobody.", "gold_label": "contradiction"}]
    run_import("snli-ve", [write_jsonl(tmp_path / "snli_ve_test.jsonl", recs)], out)
    rows, _ = _table(out, "ve", "test")
    assert rows[0] == {"id": "2248275918.jpg#0r1e", "image_id": "2248275918",
                       "hypothesis": "A person is outside.", "label": "entailment"}


def test_refcoco_plus(tmp_path):
    out = feature_world(tmp_path, "coco", [9])
    refs, inst = refcoco_files(tmp_path / "refcoco+")
    report = run_import("refcoco", [inst, refs], out)
    assert sorted(p.name for p in report.files) == ["refcoco+_testA.parquet",
                                                    "refcoco+_train.parquet"]
    rows, info = _table(out, "refexp", "refcoco+_train")
    assert rows[0] == {"ref_id": "0_0", "image_id": "9", "expression": "Man on the Right",
                       "target_box": [20.0, 5.0, 50.0, 45.0],
                       "gt_boxes": [1.0, 2.0, 11.0, 14.0, 20.0, 5.0, 50.0, 45.0],
                       "target_gt_index": 1}
    assert rows[1]["expression"] == "right guy"  # empty raw falls back to the cleaned sent
    test_a, _ = _table(out, "refexp", "refcoco+_testA")
    assert test_a[0]["target_gt_index"] == 0 and info.extra["dataset"] == "refcoco+"


def test_vcr(tmp_path):
    still = "3001_21_JUMP_STREET_00.25.01.474-00.25.06.113@0"
    out = feature_world(tmp_path, "vcr", [still])
    run_import("vcr", [write_jsonl(tmp_path / "val.jsonl", [vcr_record()])], out,
               images=str(out / "images" / "vcr"))
    rows, _ = _table(out, "vcr", "val")
    assert rows[0]["image_id"] == still
    assert rows[0]["question"] == "What is person0 doing ?"
    assert rows[0]["answers"][0] == "person0 is driving car2 ."
    assert rows[0]["rationales"][0] == "person0 and person1 are in a car ."
    assert (rows[0]["answer_label"], rows[0]["rationale_label"]) == (0, 0)


def test_flickr_karpathy_test_split_as_retrieval(tmp_path):
    out = feature_world(tmp_path, "flickr30k", [1000092795, 10002456])
    doc = karpathy_doc("flickr30k", [("1000092795.jpg", None, "test", ["a", "b"]),
                                     ("10002456.jpg", None, "train", ["c"]),
                                     ("99.jpg", None, "val", ["d"])])
    run_import("karpathy-retrieval", [write_json(tmp_path / "dataset_flickr30k.json", doc)],
               out, images=str(out / "images" / "flickr30k"))
    rows, _ = _table(out, "retrieval", "flickr30k_test")
    assert rows == [{"caption_id": "0", "image_id": "1000092795", "caption": "a"},
                    {"caption_id": "1", "image_id": "1000092795", "caption": "b"}]
