"""Malformed input gives one error naming the file and the record, and writes nothing."""

from __future__ import annotations

import base64
import json
import os
import pickle

import numpy as np
import pytest

from test_importers_fixtures import (feature_world, karpathy_doc, make_images, refcoco_files,
                                     vcr_record, vqa_docs, write_butd_tsv, write_json, write_jsonl,
                                     write_lxmert_tsv, write_uniter_npz)
from vlp.datasets.importers import InputFormatError, run_import
from vlp.datasets.importers.restricted_pickle import load_plain_pickle


def _error(name, inputs, out, **opts) -> str:
    with pytest.raises(InputFormatError) as e:
        run_import(name, inputs, out, **opts)
    return str(e.value)


def _lines(path, edit):
    """Rewrite a TSV fixture with ``edit(fields, line_index)`` applied to every line."""
    lines = path.read_text().splitlines()
    path.write_text("".join("\t".join(edit(ln.split("\t"), i)) + "\n"
                            for i, ln in enumerate(lines)))
    return path


def _nothing_written(out, source=None):
    assert not (out / "manifest.json").exists()
    if out.exists():
        leftovers = [p for p in out.rglob("*") if p.is_file() and p.name != ".manifest.lock"]
        assert leftovers == [], leftovers


# ---------------------------------------------------------------- feature files

@pytest.mark.parametrize("column, value, message", [
    (5, "!!notbase64!!", "line 2, field 'features': not valid base64"),
    (4, base64.b64encode(b"\0" * 20).decode(),
     "line 2, field 'boxes': 20 bytes, expected num_boxes × 4 × 4 (<f4) = 48"),
    (5, base64.b64encode(b"\0" * 20).decode(),
     "line 2, field 'features': 20 bytes do not divide into num_boxes = 3 rows of <f4"),
    (1, "64px", "line 2, field 'image_w': '64px' is not an integer"),
    (3, "0", "line 2, field 'num_boxes': num_boxes = 0; an image needs at least one region"),
    (5, "b'AAAA'", "line 2, field 'features': holds a Python bytes literal"),
])
def test_butd_tsv_bad_field(tmp_path, column, value, message):
    tsv = write_butd_tsv(tmp_path / "feats.tsv", make_images([1, 2, 3]))
    _lines(tsv, lambda f, i: f[:column] + [value] + f[column + 1:] if i == 1 else f)
    out = tmp_path / "data"
    assert _error("butd-tsv", [tsv], out, source="coco").startswith(f"{tsv}: {message}")
    _nothing_written(out)


def test_butd_tsv_values(tmp_path):
    images = make_images([1, 2])
    images[1]["boxes"][2] = [10, 10, 80, 20]  # x2 beyond the 64-pixel width
    tsv = write_butd_tsv(tmp_path / "a.tsv", images)
    assert _error("butd-tsv", [tsv], tmp_path / "d", source="x") == (
        f"{tsv}: line 2, field 'boxes': box 2 = [10.0, 10.0, 80.0, 20.0] (x1, y1, x2, y2) "
        f"lies outside the 64x48 image or has x2 < x1 / y2 < y1")
    images = make_images([1])
    images[0]["features"][1, 3] = np.nan
    tsv = write_butd_tsv(tmp_path / "b.tsv", images)
    assert "line 1, field 'features': region 1, value 3 is nan" in _error(
        "butd-tsv", [tsv], tmp_path / "d", source="x")


def test_layouts_are_told_apart(tmp_path):
    lx = write_lxmert_tsv(tmp_path / "obj36.tsv", make_images([1]))
    assert _error("butd-tsv", [lx], tmp_path / "d", source="x").startswith(
        f"{lx}: line 1: 10 tab-separated fields, expected 6 (image_id, image_w, image_h, "
        f"num_boxes, boxes, features); a 10-field line is the lxmert-tsv layout")
    bu = write_butd_tsv(tmp_path / "orig.tsv", make_images([1]))
    assert "the butd-tsv layout" in _error("lxmert-tsv", [bu], tmp_path / "d", source="x")


def test_duplicate_image_across_files(tmp_path):
    a = write_butd_tsv(tmp_path / "a.tsv", make_images([1, 2]))
    b = write_butd_tsv(tmp_path / "b.tsv", make_images(["000002"]))
    assert _error("butd-tsv", [a, b], tmp_path / "d", source="x") == (
        f"{b}: line 1: image id '2' appears twice (first at {a}: line 2)")


def test_lxmert_object_class_out_of_range(tmp_path):
    images = make_images([1])
    images[0]["objects"][0] = 1600
    tsv = write_lxmert_tsv(tmp_path / "a.tsv", images)
    assert _error("lxmert-tsv", [tsv], tmp_path / "d", source="x") == (
        f"{tsv}: line 1, field 'objects_id': object class 1600 of box 0 is outside 0..1599")


def test_failure_after_a_shard_was_written_leaves_nothing(tmp_path):
    tsv = write_butd_tsv(tmp_path / "a.tsv", make_images(range(6)))
    _lines(tsv, lambda f, i: f[:5] + ["%%%"] if i == 5 else f)
    out = tmp_path / "data"
    with pytest.raises(InputFormatError, match="line 6, field 'features'"):
        run_import("butd-tsv", [tsv], out, source="coco", shard_mb=0.0001)  # 1 row per shard
    _nothing_written(out)
    # and an earlier good import survives a failed overwrite untouched
    good = write_butd_tsv(tmp_path / "good.tsv", make_images([7]))
    run_import("butd-tsv", [good], out, source="coco")
    before = sorted(p.name for p in (out / "images" / "coco").iterdir())
    with pytest.raises(InputFormatError):
        run_import("butd-tsv", [tsv], out, source="coco", overwrite=True)
    assert sorted(p.name for p in (out / "images" / "coco").iterdir()) == before
    assert [p.name for p in (out / "images").iterdir()] == ["coco"]  # no staging left


def test_uniter_npz_problems(tmp_path):
    folder = write_uniter_npz(tmp_path / "npz", make_images(["a"]))
    np.savez(folder / "b.npz", features=np.zeros((2, 4), np.float32),
             conf=np.ones(2, np.float32))
    assert _error("uniter-npz", [folder / "b.npz"], tmp_path / "d", source="x",
                  nominal_size=100) == (f"{folder / 'b.npz'}: key 'norm_bb': missing array "
                                        f"'norm_bb' (has ['conf', 'features'])")
    np.savez(folder / "c.npz", features=np.array([{"evil": 1}], dtype=object))
    assert "cannot be read without unpickling" in _error(
        "uniter-npz", [folder / "c.npz"], tmp_path / "d", source="x", nominal_size=100)
    (folder / "d.npz").write_bytes(b"not a zip")
    assert _error("uniter-npz", [folder / "d.npz"], tmp_path / "d", source="x",
                  nominal_size=100).startswith(f"{folder / 'd.npz'}: not a readable .npz file")
    np.savez(folder / "e.npz", features=np.zeros((1, 4), np.float32),
             norm_bb=np.array([[0, 0, 640, 480, 640, 480]], np.float32),
             conf=np.ones(1, np.float32))
    assert "box 0 = [0.0, 0.0, 640.0, 480.0] is not normalised" in _error(
        "uniter-npz", [folder / "e.npz"], tmp_path / "d", source="x", nominal_size=100)
    sizes = write_json(tmp_path / "sizes.json", {"zzz": [10, 10]})
    assert _error("uniter-npz", [folder / "a.npz"], tmp_path / "d", source="x",
                  image_sizes=str(sizes)) == (f"{folder / 'a.npz'}: image 'a' has no entry in "
                                              f"the --image-sizes file")


# ---------------------------------------------------------------- caption files

def test_karpathy_structure(tmp_path):
    out = feature_world(tmp_path, "coco", [9])
    bad = write_json(tmp_path / "list.json", [1, 2])
    assert _error("karpathy", [bad], out) == f"{bad}: top level is a list, expected an object"
    doc = karpathy_doc("coco", [("COCO_train2014_000000000009.jpg", 9, "train", ["x"])])
    del doc["images"][0]["split"]
    p = write_json(tmp_path / "nosplit.json", doc)
    assert _error("karpathy", [p], out) == f"{p}: images[0] (image 9): missing field 'split'"
    p = tmp_path / "broken.json"
    p.write_text('{"images": [\n{"filename": "a.jpg",\n}]}')
    assert _error("karpathy", [p], out).startswith(f"{p}: line 3: not valid JSON")


def test_vg_and_web_caption_problems(tmp_path):
    out = feature_world(tmp_path, "vg", [1])
    p = write_json(tmp_path / "region_descriptions.json", {"regions": []})
    assert _error("vg-regions", [p], out) == f"{p}: top level is an object, expected a list"
    p = write_json(tmp_path / "rd.json", [{"id": 1, "regions": [{"region_id": 3}]}])
    assert _error("vg-regions", [p], out) == (f"{p}: [0] (image 1).regions[0]: missing field "
                                              f"'phrase'")
    tsv = tmp_path / "cc.tsv"
    tsv.write_text("ok\thttp://a/b.jpg\nno url here\n")
    assert _error("cc-tsv", [tsv], out, source="vg") == (
        f"{tsv}: line 2: 1 tab-separated fields, expected 2 (caption, url)")
    tsv.write_text("ok\tftp://a/b.jpg\n")
    assert _error("cc-tsv", [tsv], out, source="vg", id_from="url-sha1") == (
        f"{tsv}: line 1: 'ftp://a/b.jpg' is not an http(s) URL")
    urls, caps = tmp_path / "urls.txt", tmp_path / "caps.txt"
    urls.write_text("http://a/1.jpg\nhttp://a/2.jpg\n")
    caps.write_text("one caption\n")
    assert "1 lines, but the URL file" in _error("sbu", [urls, caps], out, source="vg")


# ---------------------------------------------------------------- task files

def test_vqa_problems(tmp_path):
    out = feature_world(tmp_path, "coco", [9])
    qs, anns = vqa_docs([(1, 9, "q?", ["a"] * 10), (2, 9, "r?", ["b"] * 10)])
    anns["annotations"].pop()
    q, a = write_json(tmp_path / "q.json", qs), write_json(tmp_path / "a.json", anns)
    assert _error("vqa", [q, a], out) == (f"{q}: questions[1] (question_id 2): question 2 has "
                                          f"no annotation in a.json")
    del anns["annotations"][0]["answers"]
    a = write_json(tmp_path / "a.json", anns)
    assert _error("vqa", [q, a], out) == (f"{a}: annotations[0] (question_id 1): missing field "
                                          f"'answers'")
    other = write_json(tmp_path / "other.json", {"info": {}})
    assert "has neither 'questions' nor 'annotations'" in _error("vqa", [q, other], out)


def test_jsonl_task_problems(tmp_path):
    out = feature_world(tmp_path, "nlvr2", ["x"])
    p = tmp_path / "dev.json"
    p.write_text('{"identifier": "dev-1-0-0", "sentence": "s", "label": "True"}\n{oops\n')
    assert _error("nlvr2", [p], out).startswith(f"{p}: line 2: not valid JSON")
    write_jsonl(p, [{"identifier": "dev-1-0-0", "sentence": "s", "label": "maybe"}])
    assert _error("nlvr2", [p], out) == (f"{p}: line 1 (dev-1-0-0): label 'maybe', expected "
                                         f"True or False")
    write_jsonl(p, [{"identifier": "dev1", "sentence": "s", "label": "True"}])
    assert "identifier 'dev1' is not <split>-<set>-<pair>-<sentence>" in _error("nlvr2", [p],
                                                                                 out)
    ve = write_jsonl(tmp_path / "snli_ve_dev.jsonl", [
        {"Flikr30kID": "1.jpg", "pairID": "p0", "sentence2": "h", "gold_label": "-"}])
    assert _error("snli-ve", [ve], out) == (f"{ve}: line 1 (pairID p0): gold_label '-', "
                                            f"expected one of ('entailment', 'neutral', "
                                            f"'contradiction')")
    vcr = write_jsonl(tmp_path / "test.jsonl", [vcr_record("test-0", question=["Who", [7]])])
    assert _error("vcr", [vcr], out) == (f"{vcr}: line 1 (test-0), question: object reference "
                                         f"7 but the image has 3 objects")
    rec = vcr_record("test-0")
    del rec["answer_label"]
    vcr = write_jsonl(tmp_path / "test.jsonl", [rec])
    assert "missing field 'answer_label' (the VCR test split has no labels" in _error(
        "vcr", [vcr], out)
    vcr = write_jsonl(tmp_path / "val.jsonl", [vcr_record(answer_label=4)])
    assert "answer_label 4, expected 0..3" in _error("vcr", [vcr], out)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_refs_pickle_is_restricted(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "refcoco+" / "refs(unc).p"
    evil.parent.mkdir()
    evil.write_bytes(pickle.dumps([{"ref_id": 0, "x": _Evil(marker)}], protocol=2))
    out = feature_world(tmp_path, "coco", [9])
    inst = write_json(tmp_path / "refcoco+" / "instances.json", {"annotations": []})
    msg = _error("refcoco", [evil, inst], out)
    assert msg.startswith(f"{evil}: refused: it refers to the global posix.system")
    assert not marker.exists()  # nothing ran
    evil.write_bytes(pickle.dumps([{"ids": {1, 2}}], protocol=4))  # built without a global
    assert _error("refcoco", [evil, inst], out) == (
        f"{evil}: refused: [0]['ids'] is a set; only plain containers (dict, list, tuple, str, "
        f"int, float, bool, None) are accepted")
    evil.write_bytes(pickle.dumps({"refs": [b"bytes"]}, protocol=4))
    assert "['refs'][0] is a bytes" in _error("refcoco", [evil, inst], out)
    evil.write_bytes(b"\x80\x02garbage")
    assert "not a readable pickle" in _error("refcoco", [evil, inst], out)
    assert load_plain_pickle(refcoco_files(tmp_path / "ok")[0])[0]["ref_id"] == 0


def test_refcoco_inconsistent_files(tmp_path):
    out = feature_world(tmp_path, "coco", [9])
    refs, inst = refcoco_files(tmp_path / "refcoco")
    doc = json.loads(inst.read_text())
    doc["annotations"] = doc["annotations"][:1]
    write_json(inst, doc)
    assert _error("refcoco", [refs, inst], out) == (f"{refs}: refs[0] (ref_id 0): ann_id 101 "
                                                    f"is not in instances.json")
    doc["annotations"][0]["bbox"] = [1, 2, -3, 4]
    write_json(inst, doc)
    assert _error("refcoco", [refs, inst], out).startswith(
        f"{inst}: annotations[0] (id 100): bbox [1, 2, -3, 4], expected [x, y, width, height]")
    assert not (out / "tasks").exists() or not list((out / "tasks").rglob("*.parquet"))
