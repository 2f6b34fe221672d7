"""Downstream adapters: task table + downstream image shards → batches of the batch contract
plus labels, for every benchmark; answer vocabulary and soft scores; segments and token
types; the rank sampler; clear errors for missing images."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from vlp.contract import batch_spec as K
from vlp.datasets.downstream import (DownstreamDataError, EpochSampler, MissingImagesError,
                                     data_config_for)
from vlp.contract import downstream_keys as D
from vlp.datasets.downstream.image_store import ImageStore
from vlp.datasets.downstream.nlvr2 import Nlvr2Data
from vlp.datasets.downstream.refexp import RefExpData
from vlp.datasets.downstream.retrieval import RetrievalData
from vlp.datasets.downstream.text import TokenizedTexts, text_batch
from vlp.datasets.downstream.vcr import VcrData
from vlp.datasets.downstream.ve import VeData
from vlp.datasets.downstream.vqa import AnswerVocab, VqaData
from vlp.datasets.storage.shards import read_image_shard, write_image_shard
from vlp.datasets.storage.world import load_manifest
from vlp.models import create_model
from vlp.benchmarks.vqa import normalize_vqa_answer, vqa_target_score


@pytest.fixture(scope="module")
def cfg(tiny_world):
    _, spec, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64)
    return data_config_for(spec, str(tiny_world))


def vocab_of(world) -> AnswerVocab:
    answers = pq.read_table(load_manifest(world).task_file("vqa", "train")).column("answers")
    return AnswerVocab.build(answers.to_pylist(), normalize_vqa_answer, vqa_target_score)


def test_answer_vocabulary_and_soft_scores():
    lists = [["Yes"] * 9 + ["no"], ["two", "2", "2", "three"] + ["2"] * 6, ["red"] * 10]
    v = AnswerVocab.build(lists, normalize_vqa_answer, vqa_target_score, min_count=1)
    assert set(v.answers) == {"yes", "2", "red"}           # majority answers, normalised
    t = v.targets(lists)
    assert t[0, v.answers.index("yes")] == 1.0 and t[0].sum() == 1.0   # "no" not in vocab
    assert t[1, v.answers.index("2")] == 1.0               # "two" normalises to "2": 9 votes
    one_vote = v.targets([["2"] + ["x"] * 9])
    assert one_vote[0, v.answers.index("2")] == pytest.approx(0.3)
    assert len(AnswerVocab.build(lists, normalize_vqa_answer, vqa_target_score,
                                 max_answers=2)) == 2
    with pytest.raises(DownstreamDataError, match="empty"):
        AnswerVocab.build(lists, normalize_vqa_answer, vqa_target_score, min_count=5)


def test_image_store_reuses_the_pipeline_region_selection(cfg, tiny_world):
    store = ImageStore.open(cfg, "val")
    table, _ = read_image_shard(load_manifest(tiny_world).image_files("downstream", "val")[0])
    assert len(store) == table.num_rows
    row = store.row_of[table.column("image_id")[0].as_py()]
    boxes = store.region_boxes(row)
    # regions kept in confidence order, each a detector box of that image
    raw = np.asarray(table.column("boxes")[0].as_py(), np.float32).reshape(-1, 4)
    assert all(any(np.allclose(b, r) for r in raw) for b in boxes)
    v = store.visual_arrays(np.array([row, row]))
    assert v[K.REGION_FEATS].shape == (2, len(boxes), 64) and v[K.REGION_LOC].shape[-1] == 7
    loc = v[K.REGION_LOC][0, :, :4] * 64    # uniter 7-d: normalised corners
    np.testing.assert_allclose(loc, np.clip(boxes, 0, 64), atol=1e-3)


@pytest.mark.parametrize("make,rows_per_example,labels", [
    (lambda c, w: VqaData(c, "train", vocab_of(w)), 1, D.TARGETS),
    (lambda c, w: VeData(c, "train"), 1, D.LABELS),
    (lambda c, w: Nlvr2Data(c, "train", "triplet"), 1, D.LABELS),
    (lambda c, w: Nlvr2Data(c, "train", "pair"), 2, D.LABELS),
    (lambda c, w: RefExpData(c, "train"), 1, D.LABELS),
    (lambda c, w: RefExpData(c, "train", "gt"), 1, D.LABELS),
    (lambda c, w: VcrData(c, "train"), 4, D.LABELS),
    (lambda c, w: RetrievalData(c, "train", negatives=2), 5, D.EXAMPLE_INDEX),
], ids=["vqa", "ve", "nlvr2-triplet", "nlvr2-pair", "refexp", "refexp-gt", "vcr", "retrieval"])
def test_every_adapter_yields_the_batch_contract(cfg, tiny_world, make, rows_per_example, labels):
    data = make(cfg, tiny_world)
    idx = np.arange(3)
    b = data.batch(idx, np.random.default_rng(0))
    rows = b[K.INPUT_IDS].shape[0]
    examples = int(b[K.NUM_EXAMPLES])
    assert rows == examples * rows_per_example
    assert b[K.TEXT_MASK].shape == b[K.INPUT_IDS].shape
    assert (b[K.INPUT_IDS][:, 0] == data.tok.cls_id).all()
    assert b[K.REGION_FEATS].shape[:2] == b[K.REGION_MASK].shape
    assert (b[K.REGION_MASK].sum(1) > 0).all()
    assert b[labels].shape[0] == examples
    assert int(b[K.INPUT_UNITS]) == rows * (b[K.INPUT_IDS].shape[1] + b[K.REGION_FEATS].shape[1])


def test_segments_get_cls_sep_and_their_token_types(cfg):
    vcr = VcrData(cfg, "train", types={"q2a": (0, 2), "qa2r": (0, 2, 3)})
    b = vcr.batch(np.array([0]), stages=("qa2r",))
    ids, types, mask = b[K.INPUT_IDS][0], b[K.TEXT_TYPE_IDS][0], b[K.TEXT_MASK][0].bool()
    seps = (ids == vcr.tok.sep_id).nonzero()[:, 0].tolist()
    assert len(seps) == 3                                   # question, answer, rationale
    assert types[1:seps[0] + 1].eq(0).all() and types[seps[0] + 1:seps[1] + 1].eq(2).all()
    assert types[seps[1] + 1:seps[2] + 1].eq(3).all() and not types[~mask].any()
    right = vcr.answer_labels[0]
    answer = vcr.answers.tokens[vcr.answers.start[right]:vcr.answers.start[right + 1]]  # row 0
    assert ids[seps[0] + 1:seps[1]].tolist() == answer.tolist()   # the right answer, always
    assert b[D.LABELS].tolist() == [vcr.rationale_labels[0]]


def test_vlbert_qa2r_puts_question_and_answer_in_a_and_the_rationale_in_b(cfg):
    """VL-BERT §4.2.1: for QA→R "the concatenation of 'Q' and 'A' is filled to the Question
    section, and 'R' is filled to the Answer section" (sentence A = 0, B = 1); Q→A is
    question A, answer B."""
    from vlp.models.families import get_family
    from vlp.models.heads import layout_types

    types = layout_types(get_family("vlbert-tiny"), "vcr")[1]["vcr_types"]
    vcr = VcrData(cfg, "train", types=types)
    b = vcr.batch(np.array([0]), stages=("qa2r",))
    ids, kinds, mask = b[K.INPUT_IDS][0], b[K.TEXT_TYPE_IDS][0], b[K.TEXT_MASK][0].bool()
    seps = (ids == vcr.tok.sep_id).nonzero()[:, 0].tolist()
    assert len(seps) == 2                                   # (question answer) [SEP] rationale
    q = vcr.questions.lengths(np.array([0]))[0]
    right = vcr.answer_labels[0]
    answer = vcr.answers.tokens[vcr.answers.start[right]:vcr.answers.start[right + 1]]
    assert ids[1 + q:seps[0]].tolist() == answer.tolist()   # right after the question
    assert kinds[:seps[0] + 1].eq(0).all()                  # [CLS] question answer [SEP]: A
    assert kinds[seps[0] + 1:seps[1] + 1].eq(1).all()       # rationale [SEP]: B
    assert not kinds[~mask].any()
    q2a = vcr.batch(np.array([0]), stages=("q2a",))
    ids, kinds = q2a[K.INPUT_IDS][0], q2a[K.TEXT_TYPE_IDS][0]
    seps = (ids == vcr.tok.sep_id).nonzero()[:, 0].tolist()
    assert kinds[:seps[0] + 1].eq(0).all() and kinds[seps[0] + 1:seps[1] + 1].eq(1).all()


def test_text_batch_truncates_and_pads(cfg):
    from vlp.datasets.stream.text_tokenizer import load_tokenizer

    tok = load_tokenizer(cfg.tokenizer_path)
    texts = TokenizedTexts.encode(tok, ["a red ball", "a very long sentence " * 10], max_len=5)
    assert texts.lengths(np.array([0, 1])).tolist() == [3, 5]
    b = text_batch(tok, [(texts, np.array([0, 1]), 0)])
    assert b[K.INPUT_IDS].shape == (2, 7) and b[K.TEXT_MASK].sum(1).tolist() == [5, 7]
    assert K.TEXT_TYPE_IDS not in b                        # all type 0: pretraining layout


def test_nlvr2_triplet_gives_the_second_image_its_own_type(cfg):
    b = Nlvr2Data(cfg, "train", "triplet", image_types=(1, 2)).batch(np.arange(2))
    types, mask = b[K.REGION_TYPE_IDS], b[K.REGION_MASK].bool()
    assert set(types[mask].tolist()) == {1, 2}
    # left regions first (type 1) then right (type 2), each image's own count
    data = Nlvr2Data(cfg, "train", "triplet")
    n_left = data.images.num_regions(data.left[:2])
    for r in range(2):
        real = types[r][mask[r]].tolist()
        assert real == [1] * n_left[r] + [2] * (len(real) - n_left[r])


def test_retrieval_groups_hold_true_negatives(cfg):
    data = RetrievalData(cfg, "train", negatives=3)
    n = 40                      # enough draws that a negative equal to its own image shows
    b = data.batch(np.arange(n), np.random.default_rng(1))
    g = int(b[D.GROUP_SIZE])
    assert g == 7 and int(b[D.IMAGE_NEGATIVES]) == int(b[D.TEXT_NEGATIVES]) == 3
    own = data.text_to_image[np.arange(n)]
    # decode each row of the batch back to (caption, image): group = [pos, 3 image negatives
    # (own caption, other images), 3 text negatives (other images' captions, own image)]
    images, captions = decode_retrieval_rows(data, b)
    images, captions = images.reshape(n, g), captions.reshape(n, g)
    assert (images[:, 0] == own).all() and (images[:, 4:] == own[:, None]).all()
    assert (images[:, 1:4] != own[:, None]).all()
    for e in range(n):
        assert all(captions[e, c] == {e} for c in range(4))       # own caption, exactly
        for c in range(4, g):                                     # a caption of another image
            assert captions[e, c] and all(data.text_to_image[t] != own[e]
                                          for t in captions[e, c])
    hard = RetrievalData(cfg, "train", negatives=1, hard_candidates=4)
    hb = hard.batch(np.arange(2), np.random.default_rng(0))
    assert int(hb[D.GROUP_SIZE]) == 9 and int(hb[D.HARD_KEEP]) == 1


def decode_retrieval_rows(data, b):
    """(gallery column of each row's regions, set of caption rows whose tokens each row holds)."""
    gallery = data.images.visual_arrays(data.gallery)[K.REGION_FEATS]
    feats = b[K.REGION_FEATS].numpy()
    n = min(gallery.shape[1], feats.shape[1])
    images = np.array([[c for c in range(len(gallery)) if np.array_equal(gallery[c, :n], f[:n])]
                       for f in feats], dtype=object)
    assert all(len(m) == 1 for m in images), "a row's regions match no or several images"
    ids, mask = b[K.INPUT_IDS], b[K.TEXT_MASK].bool()
    every = text_batch(data.tok, [(data.captions, np.arange(len(data.captions)), 0)])
    every_ids = [r[m].tolist()
                 for r, m in zip(every[K.INPUT_IDS], every[K.TEXT_MASK].astype(bool))]
    captions = np.empty(len(ids), dtype=object)
    for r in range(len(ids)):
        row = ids[r][mask[r]].tolist()
        captions[r] = {t for t, e in enumerate(every_ids) if e == row}
    return np.array([m[0] for m in images]), captions


def test_epoch_sampler_shares_are_disjoint_and_resume_exactly():
    a, b = EpochSampler(10, 3, seed=7, rank=0, world_size=2), \
        EpochSampler(10, 3, seed=7, rank=1, world_size=2)
    first = np.concatenate([a.next(), a.next()])        # rank 0's 5 of epoch 0
    other = np.concatenate([b.next(), b.next()])
    assert len(set(first) | set(other)) == 10 and not set(first) & set(other)
    state = a.state_dict()
    nxt = [a.next().tolist() for _ in range(3)]
    c = EpochSampler(10, 3, seed=7, rank=0, world_size=2)
    c.load_state_dict(state)
    assert [c.next().tolist() for _ in range(3)] == nxt
    with pytest.raises(ValueError, match="cannot be shared"):
        EpochSampler(1, 3, seed=0, rank=0, world_size=2)


def test_missing_image_ids_are_named_and_counted(cfg, tiny_world, tmp_path):
    world = tmp_path / "world"
    shutil.copytree(tiny_world, world)
    m = load_manifest(world)
    shard = m.image_files("downstream", "train")[0]
    table, info = read_image_shard(shard)
    dropped = table.column("image_id").to_pylist()[:3]
    write_image_shard(shard, table.slice(3), feature_extractor=info.feature_extractor,
                      feature_dim=info.feature_dim, num_classes=info.num_classes)
    c = data_config_for_world(cfg, world)
    with pytest.raises(MissingImagesError) as e:
        VeData(c, "train")
    msg = str(e.value)
    assert "tasks/ve/train.parquet" in msg and "3 of 40 image ids are missing" in msg
    assert repr(dropped[0]) in msg and "downstream/train-00000.parquet" in msg


def data_config_for_world(cfg, world):
    return cfg.model_copy(update={"world": str(world)})


def test_refexp_labels_detected_by_iou_and_gt_by_index(cfg):
    from vlp.benchmarks.refcoco_plus import box_iou

    det = RefExpData(cfg, "train", "detected")     # train holds both kinds of expression
    assert 0 < det.unlabelled < len(det) and len(det.labelled) == len(det) - det.unlabelled
    for k in range(len(det)):
        iou = np.array([box_iou(r, det.target_boxes[k]) for r in det.region_boxes(k)])
        if det.labels[k] >= 0:       # the label is the region of highest IoU, and it is >= 0.5
            assert det.labels[k] == int(iou.argmax()) and iou.max() >= 0.5
        else:                        # left unlabelled only when no region reaches 0.5
            assert iou.max() < 0.5
    # the 0.5 line itself: a target shrunk to 0.45 of its best region's width is unlabelled
    k = int(det.labelled[0])
    x1, y1, x2, y2 = det.region_boxes(k)[det.labels[k]]
    det.target_boxes[k] = [x1, y1, x1 + 0.45 * (x2 - x1), y2]
    iou = np.array([box_iou(r, det.target_boxes[k]) for r in det.region_boxes(k)])
    assert 0.3 < iou.max() < 0.5 and det._best_region(k) == -1
    gt = RefExpData(cfg, "val", "gt")
    picked = np.stack([gt.region_boxes(k)[gt.labels[k]] for k in range(len(gt))])
    np.testing.assert_allclose(picked, gt.target_boxes, atol=1e-3)


def test_unknown_options_of_adapters_fail_clearly(cfg):
    with pytest.raises(DownstreamDataError, match="unknown NLVR2 variant"):
        Nlvr2Data(cfg, "train", "quadruplet")
    with pytest.raises(DownstreamDataError, match="box setting"):
        RefExpData(cfg, "train", "predicted")


def test_retrieval_eval_images_keeps_the_first_images_and_all_their_captions(cfg):
    full = RetrievalData(cfg, "val")
    part = RetrievalData(cfg, "val", max_images=3)
    assert part.image_ids == full.image_ids[:3]
    kept = [t for t in range(len(full)) if full.text_to_image[t] < 3]
    assert len(part) == len(kept) > 3                       # every caption of those images
    assert part.column("caption_id") == [full.column("caption_id")[t] for t in kept]

    def pieces(d, t):
        return d.captions.tokens[d.captions.start[t]:d.captions.start[t + 1]]
    assert all((pieces(part, i) == pieces(full, t)).all() for i, t in enumerate(kept))
    assert (part.text_to_image == full.text_to_image[kept]).all()
    assert len(RetrievalData(cfg, "val", max_images=10**6)) == len(full)
