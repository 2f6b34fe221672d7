"""`vlp data curate` on imported web pairs (BUTD features + a Conceptual Captions TSV), with
and without an ITM model, and the checkpoint formats the semantic filter reads."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from test_importers_fixtures import make_images, write_butd_tsv
from vlp.platform.curation import CurationConfig, curate_source
from vlp.platform.curation.itm_checkpoint import (ItmCheckpointError, load_scoring_model,
                                                  save_model_card)
from vlp.platform.curation.itm_scorer import ItmScorer
from vlp.datasets.importers import run_import
from vlp.datasets.storage.shards import read_image_shard
from vlp.datasets.storage.world import load_manifest

CAPTIONS = [
    "a red ball on a table",                      # 0 kept
    "<b>a dog</b> &amp; a cat http://x.com/a",    # 1 cleaned to "a dog & a cat"
    "IMG",                                        # 2 too short
    "dsc00123 ff7a9b2c qwzx zzxq",                # 3 out of vocabulary
    "click here to read more",                    # 4-6 one text on three images
    "click here to read more",
    "Click here to read more!",
    "a blue box",                                 # 7 a banner: 400 x 40
]


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("web")
    images = make_images(range(7), seed=5) + make_images([7], size=(400, 40), seed=6)
    out = tmp / "data"
    run_import("butd-tsv", [write_butd_tsv(tmp / "cc.tsv", images)], out, source="cc")
    tsv = tmp / "captions.tsv"
    tsv.write_text("".join(f"{c}\thttp://img/{i}.jpg\n" for i, c in enumerate(CAPTIONS)))
    run_import("cc-tsv", [tsv], out)
    return out


@pytest.fixture(scope="module")
def itm_model(web, tmp_path_factory):
    """A random uniter-tiny with an ITM head, saved as a weights file + model card."""
    from vlp.models import create_model
    m = load_manifest(web)
    torch.manual_seed(0)
    model = create_model("uniter-tiny", ["itm", "mlm"], region_feat_dim=m.feature_dim,
                         num_classes=m.num_classes or 2).model
    folder = tmp_path_factory.mktemp("model")
    torch.save(model.state_dict(), folder / "weights.pt")
    save_model_card(folder, "uniter-tiny")
    return folder / "weights.pt", model


def test_cli_curates_web_pairs(web, tmp_path, capsys):
    from vlp.cli import main

    out = tmp_path / "curated"
    assert main(["data", "curate", str(web), "--source", "cc", "--out", str(out),
                 "--max-images-per-text", "2"]) == 0
    printed = capsys.readouterr().out
    assert "text_frequency" in printed and "pairs 8 → 2" in printed
    report = json.loads((out / "meta/curation/cc.json").read_text())
    assert report["removed"] == {"image_size": 1, "clean": 0, "length": 1, "vocabulary": 1,
                                 "text_frequency": 3, "aggregate": 0}
    m = load_manifest(out)
    assert m.sources["cc"].pairs == 2 and m.sources["cc"].domain == "out"
    table, _ = read_image_shard(m.image_files("cc")[0])
    # images that lost every caption left the corpus
    assert {r["image_id"]: r["captions"] for r in table.to_pylist()} == {
        "0": ["a red ball on a table"], "1": ["a dog & a cat"]}
    removed = pq.read_table(out / "meta/curation/cc.removed.parquet").to_pylist()
    assert {(r["image_id"], r["filter"]) for r in removed} == {
        ("2", "length"), ("3", "vocabulary"), ("4", "text_frequency"),
        ("5", "text_frequency"), ("6", "text_frequency"), ("7", "image_size")}
    assert json.loads((out / "meta/imports.jsonl").read_text().splitlines()[-1])[
        "importer"] == "curate"
    # the output exists now: a second run needs --overwrite; bad options are errors
    assert main(["data", "curate", str(web), "--source", "cc", "--out", str(out)]) == 2
    assert main(["data", "curate", str(web), "--source", "cc", "--out", str(out),
                 "--overwrite", "--skip", "text_frequency", "--as", "cc_clean"]) == 0
    assert load_manifest(out).sources["cc_clean"].pairs == 5
    assert main(["data", "curate", str(web), "--source", "nope", "--out", str(out)]) == 2
    assert main(["data", "curate", str(web), "--source", "cc", "--out", str(out),
                 "--min-itm-score", "0.5"]) == 2
    assert main(["data", "curate", str(web), "--source", "cc", "--out", str(out),
                 "--max-oov-ratio", "2"]) == 2
    assert "max_oov_ratio" in capsys.readouterr().err


def test_cli_with_an_itm_checkpoint(web, itm_model, tmp_path, capsys):
    from vlp.cli import main

    weights, _ = itm_model
    out = tmp_path / "curated"
    assert main(["data", "curate", str(web), "--source", "cc", "--out", str(out),
                 "--checkpoint", str(weights), "--min-itm-score", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["itm"]["family"] == "uniter-tiny" and report["itm"]["scored_pairs"] == 5
    assert report["removed"]["itm"] == 0
    assert main(["data", "curate", str(web), "--source", "cc", "--out", str(out),
                 "--overwrite", "--checkpoint", str(weights), "--min-itm-score", "1"]) == 0
    assert json.loads((out / "meta/curation/cc.json").read_text())["removed"]["itm"] == 5
    assert load_manifest(out).sources["cc"].pairs == 0


def test_itm_scores_match_the_model_and_ignore_batching(web, itm_model):
    weights, model = itm_model
    m = load_manifest(web)
    scoring = load_scoring_model(weights, region_feat_dim=m.feature_dim,
                                 num_classes=m.num_classes or 2)
    from vlp.platform.curation.pairs import load_pairs
    pairs = load_pairs(m.image_files("cc"))
    which = np.arange(pairs.num_pairs)
    one = ItmScorer(scoring, batch_size=1, feature_dim=m.feature_dim,
                    num_classes=m.num_classes).score(pairs, which)
    many = ItmScorer(scoring, batch_size=64, feature_dim=m.feature_dim,
                     num_classes=m.num_classes).score(pairs, which)
    assert np.allclose(one, many, atol=1e-5) and ((one > 0) & (one < 1)).all()
    # by hand, from the detector output the fixture imported: softmax(itm(encode))[:, 1]
    from vlp.datasets.stream.text_tokenizer import load_tokenizer
    detections = {str(d["id"]): d for d in make_images(range(7), seed=5)}
    tok = load_tokenizer(None)
    first_two = which[:2]
    hand = [hand_itm_score(model, tok, detections[pairs.image_id[pairs.image[p]]],
                           pairs.text[p]) for p in first_two]
    np.testing.assert_allclose(one[:2], hand, atol=1e-5)
    # the same two images with their captions swapped: other pairs, other scores
    swapped = [hand_itm_score(model, tok, detections[pairs.image_id[pairs.image[p]]],
                              pairs.text[q]) for p, q in zip(first_two, first_two[::-1])]
    assert not np.allclose(swapped, hand, atol=1e-3)
    pairs.text[0], pairs.text[1] = pairs.text[1], pairs.text[0]
    rescored = ItmScorer(scoring, batch_size=64, feature_dim=m.feature_dim,
                         num_classes=m.num_classes).score(pairs, first_two)
    np.testing.assert_allclose(rescored, swapped, atol=1e-5)
    # the loaded weights are the saved ones: the scores do not depend on the load path
    again = load_scoring_model(weights, region_feat_dim=m.feature_dim,
                               num_classes=m.num_classes or 2)
    assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(),
                                                  scoring.model.state_dict().values()))
    assert torch.equal(scoring.model.heads["itm"].weight, model.heads["itm"].weight)


def hand_itm_score(model, tok, detection: dict, text: str) -> float:
    """P(match) of one pair built without the pipeline: [CLS] pieces [SEP]; every detector
    region (fp16 as the shards store it) with UNITER's 7-d location; column 1 of the ITM
    head's softmax on the pooled [CLS]."""
    from vlp.contract import batch_spec as K
    pieces, _ = tok.encode([text])
    ids = torch.tensor([[tok.cls_id, *pieces.tolist(), tok.sep_id]])
    b, w, h = detection["boxes"], detection["w"], detection["h"]
    x1, y1, x2, y2 = (np.clip(b / [w, h, w, h], 0, 1)).T
    loc = np.stack([x1, y1, x2, y2, x2 - x1, y2 - y1, (x2 - x1) * (y2 - y1)], 1)
    feats = torch.from_numpy(detection["features"].astype(np.float16))
    batch = {K.INPUT_IDS: ids, K.TEXT_MASK: torch.ones_like(ids),
             K.REGION_FEATS: feats[None],
             K.REGION_LOC: torch.tensor(loc[None], dtype=torch.float32),
             K.REGION_MASK: torch.ones(1, len(b), dtype=torch.long)}
    model.eval()
    with torch.no_grad():
        logits = model.heads["itm"](model.encode(batch, pool=True).pooled_output)
    return float(torch.softmax(logits.float(), -1)[0, 1])


def test_checkpoint_formats(web, itm_model, tmp_path):
    from vlp.models import create_model, save_uniter
    weights, model = itm_model
    dims = dict(region_feat_dim=load_manifest(web).feature_dim, num_classes=2)
    ref = model.heads["itm"].weight
    # the UNITER release layout, family named on the command line
    save_uniter(model, tmp_path / "uniter.pt")
    with pytest.raises(ItmCheckpointError, match="pass --family"):
        load_scoring_model(tmp_path / "uniter.pt", **dims)
    got = load_scoring_model(tmp_path / "uniter.pt", family="uniter-tiny", **dims)
    assert torch.equal(got.model.heads["itm"].weight, ref)
    # a vlp pretraining checkpoint folder: vlp_trainer.json + the DeepSpeed module file
    ckpt = tmp_path / "run" / "checkpoint_000001"
    (ckpt / "step00000010").mkdir(parents=True)
    (ckpt / "vlp_trainer.json").write_text(json.dumps({"step": 10, "tag": "step00000010"}))
    torch.save({"module": model.state_dict(), "global_steps": 10, "ds_version": "0.16"},
               ckpt / "step00000010" / "mp_rank_00_model_states.pt")
    got = load_scoring_model(ckpt, **dims)     # no card: the tensors say uniter-tiny
    assert got.preprocess.family == "uniter-tiny"
    assert torch.equal(got.model.heads["itm"].weight, ref)
    save_model_card(tmp_path / "run", "uniter-tiny")        # the run folder's card
    got = load_scoring_model(tmp_path / "run", **dims)     # a run folder: its latest
    assert torch.equal(got.model.heads["itm"].weight, ref)
    # no ITM head, wrong family, wrong feature width: errors that say so
    mlm_only = create_model("uniter-tiny", ["mlm"], **dims).model
    torch.save(mlm_only.state_dict(), tmp_path / "mlm.pt")
    with pytest.raises(ItmCheckpointError, match="no ITM head"):
        load_scoring_model(tmp_path / "mlm.pt", family="uniter-tiny", **dims)
    with pytest.raises(ItmCheckpointError, match="shape"):
        load_scoring_model(weights, region_feat_dim=dims["region_feat_dim"] + 1,
                           num_classes=2)
    with pytest.raises(ItmCheckpointError, match="has no place in this model"):
        load_scoring_model(weights, family="imagebert-tiny", **dims)


def test_a_vocabulary_other_than_the_packaged_one_needs_its_tokenizer(web, tmp_path):
    from vlp.models import create_model, save_uniter
    dims = dict(region_feat_dim=load_manifest(web).feature_dim, num_classes=2)
    cased = create_model("uniter-tiny", ["itm"], vocab_size=120, **dims).model
    save_uniter(cased, tmp_path / "cased.pt")
    scoring = load_scoring_model(tmp_path / "cased.pt", family="uniter-tiny", **dims)
    assert scoring.preprocess.vocab_size == 120
    with pytest.raises(ItmCheckpointError, match="--tokenizer"):
        ItmScorer(scoring, feature_dim=dims["region_feat_dim"], num_classes=2)
    with pytest.raises(ItmCheckpointError, match="the model embeds 120"):
        ItmScorer(scoring, feature_dim=dims["region_feat_dim"], num_classes=2,
                  tokenizer_path=str(_packaged_vocab()))


def _packaged_vocab():
    from vlp.datasets.stream.text_tokenizer import default_vocab_dir
    return default_vocab_dir()
