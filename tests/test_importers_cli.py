"""`vlp data import` end to end: help for every format, exit codes, one-line errors."""

from __future__ import annotations

import pytest

from test_importers_fixtures import karpathy_doc, make_images, vqa_docs, write_butd_tsv, write_json
from vlp.cli import main
from vlp.datasets.importers import IMPORTERS
from vlp.datasets.storage.world import load_manifest


def test_help_lists_every_format_and_option(capsys):
    with pytest.raises(SystemExit):
        main(["data", "import", "--help"])
    text = capsys.readouterr().out
    for name, imp in IMPORTERS.items():
        assert name in text and imp.summary in text
    for name, imp in IMPORTERS.items():
        with pytest.raises(SystemExit):
            main(["data", "import", name, "--help"])
        text = capsys.readouterr().out
        for option in ("--out", "--overwrite", *(o.flag for o in imp.options)):
            assert option in text, (name, option)


def test_cli_features_captions_task_then_validate(tmp_path, capsys):
    out = tmp_path / "data"
    tsv = write_butd_tsv(tmp_path / "coco.tsv", make_images([391895, 9]))
    assert main(["data", "import", "butd-tsv", str(tsv), "--source", "coco", "--out",
                 str(out), "--feature-extractor", "butd-r101-vg"]) == 0
    doc = karpathy_doc("coco", [("COCO_val2014_000000391895.jpg", 391895, "test", ["A cat."]),
                                ("COCO_train2014_000000000009.jpg", 9, "train", ["A dog."])])
    assert main(["data", "import", "karpathy", str(write_json(tmp_path / "k.json", doc)),
                 "--out", str(out)]) == 0
    qs, anns = vqa_docs([(1, 9, "What animal?", ["dog"] * 10)], subtype="train2014")
    assert main(["data", "import", "vqa", str(write_json(tmp_path / "q.json", qs)),
                 str(write_json(tmp_path / "a.json", anns)), "--out", str(out),
                 "--images", str(out / "images" / "coco")]) == 0
    printed = capsys.readouterr().out
    assert "vqa: wrote 1 file(s) (1 rows)" in printed
    assert main(["data", "validate", str(out)]) == 0
    assert "ok: 3 files, 3 rows" in capsys.readouterr().out
    world = load_manifest(out)
    assert world.tasks == {"vqa": {"train": "tasks/vqa/train.parquet"}}
    assert sorted(world.sources["coco"].splits.items()) == [("test", 1), ("train", 1)]
    log = (out / world.sidecars["imports"]).read_text().splitlines()
    assert [line.split('"importer": ')[1].split('"')[1] for line in log] == [
        "butd-tsv", "karpathy", "vqa"]


def test_cli_error_is_one_line_naming_file_and_record(tmp_path, capsys):
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("1\t64\t48\t1\tAAAA\tAAAA\n")
    assert main(["data", "import", "butd-tsv", str(tsv), "--source", "coco", "--out",
                 str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"vlp data: error: {tsv}: line 1, field 'boxes': 3 bytes, expected "
                   f"num_boxes × 4 × 4 (<f4) = 16")


def test_cli_usage_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):  # --source is required for feature formats
        main(["data", "import", "butd-tsv", "x.tsv", "--out", str(tmp_path)])
    assert "--source" in capsys.readouterr().err
    assert main(["data", "import", "sbu", "only-one.txt", "--out", str(tmp_path)]) == 1
    assert "sbu takes 2 input file(s)" in capsys.readouterr().err
