"""Each benchmark's prediction → metric wiring, end to end through its ``evaluate``: a model
that knows the gold answer scores 100 (or the best the answer vocabulary allows), one that
always picks a wrong answer scores 0.

The oracle reads only what a real model sees — the batch — plus the raw task table, and
answers in the model's output format (VQA answer logits, region scores, choice scores,
match scores). The gold comes from the table's own columns (annotator answers, label
strings, target boxes, choice indices, each caption's image), not from the adapters' label
arrays, so a shuffled prediction order, a wrong answer index → string map, a wrong region →
box map or a transposed retrieval matrix shows."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from vlp.contract import batch_spec as K
from vlp.datasets.downstream import data_config_for
from vlp.contract import downstream_keys as D
from vlp.datasets.storage.task_tables import VE_LABELS
from vlp.datasets.storage.world import load_manifest
from vlp.models import create_model
from vlp.benchmarks.refcoco_plus import box_iou
from vlp.benchmarks.vqa import vqa_accuracy
from vlp.benchmarks import BenchmarkContext, get_benchmark
from vlp.benchmarks.eval_runner import EvalRunner

torch.set_num_threads(1)


class Oracle(nn.Module):
    """``predict(batch)`` → ``answer(batch, right)`` (right: the gold answer, or a wrong one)."""

    def __init__(self, answer, right: bool):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))     # EvalRunner reads the dtype
        self.answer, self.right = answer, right

    def predict(self, batch):
        return torch.as_tensor(self.answer(batch, self.right), dtype=torch.float32)


def one_hot(index, width) -> np.ndarray:
    out = np.zeros((len(index), width), np.float32)
    out[np.arange(len(index)), index] = 1.0
    return out


@pytest.fixture(scope="module")
def setting(tiny_world):
    base, spec, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64)
    return base.family, data_config_for(spec, str(tiny_world))


def evaluate(setting, name: str, answer, right: bool, **options):
    family, data_cfg = setting
    bench = get_benchmark(name)
    ctx = BenchmarkContext(data_cfg, bench.options(options), family, "val", 0)
    data = bench.eval_data(ctx)
    result = bench.evaluate(ctx, data, EvalRunner(Oracle(answer(data), right), batch_size=7))
    # the metric meta_sum.PARTS names for each of its parts is one the benchmark reports, and
    # so is its headline (the finetune's report and summary line read it)
    assert set(bench.meta_parts.values()) <= set(result.metrics)
    assert bench.primary in result.metrics
    return result.metrics, data


def table(data) -> dict[str, list]:
    return pq.read_table(data.path).to_pydict()


def test_vqa_answer_index_to_answer_string(setting):
    def answer(data):
        raw, vocab = table(data)["answers"], data.vocab.answers
        acc = np.array([[vqa_accuracy(a, raw[k]) for a in vocab] for k in range(len(raw))])
        answer.best = acc.max(1).mean() * 100
        pick = lambda b, right: (acc[b[D.EXAMPLE_INDEX].numpy()].argmax(1) if right
                                 else acc[b[D.EXAMPLE_INDEX].numpy()].argmin(1))
        return lambda b, right: one_hot(pick(b, right), len(vocab))

    good, data = evaluate(setting, "vqa", answer, True)
    assert good["vqa_score"] == pytest.approx(answer.best) and answer.best > 50
    bad, _ = evaluate(setting, "vqa", answer, False)
    assert bad["vqa_score"] == 0.0


@pytest.mark.parametrize("name,options", [("ve", {}), ("nlvr2", {"variant": "triplet"}),
                                          ("nlvr2", {"variant": "pair"})],
                         ids=["ve", "nlvr2-triplet", "nlvr2-pair"])
def test_classification_argmax(setting, name, options):
    def answer(data):
        raw = table(data)["label"]
        gold = np.array([VE_LABELS.index(x) if name == "ve" else int(x) for x in raw])
        n = 3 if name == "ve" else 2
        return lambda b, right: one_hot((gold[b[D.EXAMPLE_INDEX].numpy()] + 1 - right) % n, n)

    key = f"{name}_acc"
    assert evaluate(setting, name, answer, True, **options)[0][key] == 100.0
    assert evaluate(setting, name, answer, False, **options)[0][key] == 0.0


@pytest.mark.parametrize("name", ["refcoco+", "refcoco+-gt"])
def test_refcoco_region_to_box_to_iou(setting, tiny_world, name):
    """The oracle picks, among the regions the batch holds, the one whose box (decoded from
    the batch's normalised location features and the image size) best overlaps the target
    box of the raw table; the anti-oracle the worst one."""
    files = load_manifest(tiny_world).image_files()
    sizes = {r["image_id"]: (r["width"], r["height"]) for f in files
             for r in pq.read_table(f, columns=["image_id", "width", "height"]).to_pylist()}

    def answer(data):
        raw = table(data)
        targets = np.array(raw["target_box"], np.float64)
        image = raw["image_id"]

        def pick(b, right):
            out = np.full(b[K.REGION_MASK].shape, -1e9, np.float32)
            for row, k in enumerate(b[D.EXAMPLE_INDEX].tolist()):
                w, h = sizes[image[k]]
                real = b[K.REGION_MASK][row].bool().numpy()
                boxes = b[K.REGION_LOC][row, :, :4].double().numpy() * [w, h, w, h]
                iou = box_iou(boxes, targets[k])
                out[row, real] = iou[real] if right else -iou[real]
            return out
        return pick

    key = f"{name.replace('+', 'plus')}_acc"
    good, data = evaluate(setting, name, answer, True)
    assert good[key] == 100.0
    assert evaluate(setting, name, answer, False)[0][key] == 0.0


def test_vcr_q2ar_needs_both_stages_right(setting):
    """Q→A rows hold two [SEP]s (question, answer), QA→R rows three (…, rationale)."""
    def answer(data, wrong_stage=None):
        raw = table(data)
        gold = {2: np.array(raw["answer_label"]), 3: np.array(raw["rationale_label"])}
        sep = data.tok.sep_id

        def pick(b, right):
            n = len(b[D.LABELS])
            stage = int((b[K.INPUT_IDS][0] == sep).sum())
            shift = 0 if right and stage != wrong_stage else 1
            return one_hot((gold[stage][b[D.EXAMPLE_INDEX].numpy()[:n]] + shift) % 4, 4)
        return pick

    assert evaluate(setting, "vcr", answer, True)[0] == {"q2a": 100.0, "qa2r": 100.0,
                                                         "q2ar": 100.0}
    assert evaluate(setting, "vcr", answer, False)[0] == {"q2a": 0.0, "qa2r": 0.0, "q2ar": 0.0}
    wrong_rationale = lambda data: answer(data, wrong_stage=3)
    assert evaluate(setting, "vcr", wrong_rationale, True)[0] == {"q2a": 100.0, "qa2r": 0.0,
                                                                  "q2ar": 0.0}


class PairDecoder:
    """(caption, gallery column) of each row of a retrieval pair batch, from its tokens and
    region features alone. A caption is known by its tokens: the first caption row with them
    (``owners`` lists every image that has a caption with those tokens)."""

    def __init__(self, data):
        from vlp.datasets.downstream.text import text_batch

        every = text_batch(data.tok, [(data.captions, np.arange(len(data.captions)), 0)])
        raw = table(data)
        self.caption, self.owners, self.first = {}, {}, []
        self.image_of = [data.image_ids.index(i) for i in raw["image_id"]]
        for t, (ids, m) in enumerate(zip(every[K.INPUT_IDS], every[K.TEXT_MASK])):
            key = tuple(ids[m.astype(bool)].tolist())
            self.first.append(self.caption.setdefault(key, t))
            self.owners.setdefault(self.first[-1], set()).add(self.image_of[t])
        feats = data.images.visual_arrays(data.gallery)[K.REGION_FEATS]
        masks = data.images.visual_arrays(data.gallery)[K.REGION_MASK].astype(bool)
        self.image = {np.asarray(f[m], np.float16).tobytes(): c
                      for c, (f, m) in enumerate(zip(feats, masks))}
        assert len(self.image) == len(data.image_ids)      # no two images alike

    def r1_of_oracle(self) -> tuple[float, float]:
        """Identical captions of different images are one input: the oracle scores 1 every
        image that has a caption with those tokens, so such a text's own image ties with the
        others and, ties broken at random, is first with probability 1/len(owners) (IR);
        an image's column holds 1 for every text some caption of it shares tokens with, j of
        them its own of m, so its R@1 is j/m (TR). Percent, (IR R@1, TR R@1)."""
        ir = [1 / len(self.owners[f]) for f in self.first]
        tr = []
        for c in range(len(self.image)):
            ones = [t for t in range(len(self.first)) if c in self.owners[self.first[t]]]
            tr.append(sum(self.image_of[t] == c for t in ones) / len(ones))
        return 100.0 * float(np.mean(ir)), 100.0 * float(np.mean(tr))

    def __call__(self, b):
        texts = [self.caption[tuple(ids[m.bool()].tolist())]
                 for ids, m in zip(b[K.INPUT_IDS], b[K.TEXT_MASK])]
        images = [self.image[np.asarray(f[m.bool()], np.float16).tobytes()]
                  for f, m in zip(b[K.REGION_FEATS].numpy(), b[K.REGION_MASK])]
        return np.array(texts), np.array(images)


def test_retrieval_both_directions(setting):
    def answer(data, offset=None):
        decode = PairDecoder(data)
        answer.ir_r1, answer.tr_r1 = decode.r1_of_oracle()

        def score(b, right):
            t, i = decode(b)
            match = np.array([c in decode.owners[x] for x, c in zip(t, i)], np.float32)
            s = match if right else -match
            if offset == "text":     # a per-query-text constant: text→image ranks unchanged
                s = s - 10.0 * t
            elif offset == "image":  # a per-image constant: image→text ranks unchanged
                s = s - 10.0 * i
            return s
        return score

    good, data = evaluate(setting, "retrieval", answer, True)
    assert len(data.image_ids) > 10 and len(data) > 15
    assert all(good[k] == 100.0 for k in ("ir_r5", "ir_r10", "tr_r5", "tr_r10"))
    assert good["ir_r1"] == pytest.approx(answer.ir_r1) and answer.ir_r1 >= 90
    assert good["tr_r1"] == pytest.approx(answer.tr_r1) and answer.tr_r1 >= 90
    bad, _ = evaluate(setting, "retrieval", answer, False)
    assert all(bad[k] == 0.0 for k in ("ir_r1", "ir_r5", "ir_r10", "tr_r1", "tr_r5", "tr_r10"))
    # IR ranks the images in each text's row, TR the texts in each image's column
    by_text, _ = evaluate(setting, "retrieval", lambda d: answer(d, "text"), True)
    assert by_text["ir_r1"] == pytest.approx(answer.ir_r1) and by_text["tr_r1"] < 50.0
    by_image, _ = evaluate(setting, "retrieval", lambda d: answer(d, "image"), True)
    assert by_image["tr_r1"] == pytest.approx(answer.tr_r1) and by_image["ir_r1"] < 50.0
    print("oracle R@1 under duplicate captions:", answer.ir_r1, answer.tr_r1)


# ---- a constant predictor (every choice one score: a collapsed model, or scores saturated
# in fp16) scores chance on every benchmark, each chance computed here from the raw table

def constant(width_of):
    return lambda data: (lambda b, right: np.zeros(width_of(data, b), np.float32))


def test_constant_predictor_scores_chance_on_choice_benchmarks(setting):
    rows = lambda b: len(b[D.LABELS])                                    # noqa: E731
    ve, _ = evaluate(setting, "ve", constant(lambda d, b: (rows(b), 3)), True)
    assert ve["ve_acc"] == pytest.approx(100 / 3)
    for variant in ("pair", "triplet"):
        nlvr2, _ = evaluate(setting, "nlvr2", constant(lambda d, b: (rows(b), 2)), True,
                            variant=variant)
        assert nlvr2["nlvr2_acc"] == pytest.approx(50.0)
    vcr, _ = evaluate(setting, "vcr", constant(lambda d, b: (rows(b), 4)), True)
    assert vcr == pytest.approx({"q2a": 25.0, "qa2r": 25.0, "q2ar": 6.25})


def test_constant_predictor_scores_chance_on_vqa(setting):
    vqa, data = evaluate(setting, "vqa", constant(lambda d, b: (len(b[D.EXAMPLE_INDEX]),
                                                                 len(d.vocab.answers))), True)
    raw = table(data)["answers"]
    # chance: a uniformly random answer of the vocabulary, scored by the official metric
    chance = np.mean([[vqa_accuracy(a, raw[k]) for a in data.vocab.answers]
                      for k in range(len(raw))])
    assert vqa["vqa_score"] == pytest.approx(100 * chance)
    assert 0 < chance < 0.5


@pytest.mark.parametrize("name", ["refcoco+", "refcoco+-gt"])
def test_constant_predictor_scores_chance_on_refcoco(setting, tiny_world, name):
    """Every real region scores 0, padding the head's mask value: chance is, per expression,
    the fraction of its regions whose box has IoU > 0.5 with the target."""
    from vlp.models.heads.refexp import NEG

    def answer(data):
        answer.chance = 100 * np.mean([
            (box_iou(data.region_boxes(k), data.target_boxes[k]) > 0.5).mean()
            for k in range(len(data))])
        return lambda b, right: np.where(b[K.REGION_MASK].bool().numpy(), 0.0, NEG)

    key = f"{name.replace('+', 'plus')}_acc"
    result, _ = evaluate(setting, name, answer, True)
    assert result[key] == pytest.approx(answer.chance) and 0 < answer.chance < 50


def test_constant_predictor_scores_chance_on_retrieval(setting):
    """IR: R@K = K/N over N images. TR: an image with c of the N texts as captions is hit
    when any of them lands in the top K of a random order: 1 - C(N-c, K)/C(N, K)."""
    from math import comb

    result, data = evaluate(setting, "retrieval", constant(lambda d, b: (len(b[K.INPUT_IDS]),)),
                            True)
    n_img, n_txt = len(data.image_ids), len(data)
    captions = np.bincount(data.text_to_image, minlength=n_img)
    for k in (1, 5, 10):
        assert result[f"ir_r{k}"] == pytest.approx(100 * k / n_img)
        tr = np.mean([1 - comb(n_txt - c, k) / comb(n_txt, k) for c in captions if c])
        assert result[f"tr_r{k}"] == pytest.approx(100 * tr)
    assert result["ir_r1"] < 10


# ---- a model whose every score is NaN or ±inf (diverged, or overflowed in fp16/bf16) scores 0
# on every benchmark, through its own evaluate: non-finite scores never hit (issue 39)

@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_predictor_scores_zero_everywhere(setting, bad):
    def filled(width_of):
        return lambda data: (lambda b, right: np.full(width_of(data, b), bad, np.float32))

    rows = lambda b: len(b[D.LABELS])                                    # noqa: E731
    got = {}
    got["ve"], _ = evaluate(setting, "ve", filled(lambda d, b: (rows(b), 3)), True)
    for variant in ("pair", "triplet", "pair-biattn"):
        got[variant], _ = evaluate(setting, "nlvr2", filled(lambda d, b: (rows(b), 2)), True,
                                   variant=variant)
    got["vcr"], _ = evaluate(setting, "vcr", filled(lambda d, b: (rows(b), 4)), True)
    got["vqa"], _ = evaluate(setting, "vqa", filled(
        lambda d, b: (len(b[D.EXAMPLE_INDEX]), len(d.vocab.answers))), True)
    got["retrieval"], _ = evaluate(setting, "retrieval",
                                   filled(lambda d, b: (len(b[K.INPUT_IDS]),)), True)
    for name in ("refcoco+", "refcoco+-gt"):     # raised IndexError on NaN
        got[name], _ = evaluate(setting, name, filled(
            lambda d, b: tuple(b[K.REGION_MASK].shape)), True)
    for name, metrics in got.items():
        scored = {k: v for k, v in metrics.items() if k != "answer_coverage"}
        assert scored == {k: 0.0 for k in scored}, name


def test_the_report_reads_each_benchmarks_headline():
    """``Benchmark.primary`` is what the finetune's summary prints for a benchmark that is
    not a Meta-Sum part itself (retrieval's r_mean, VE's accuracy)."""
    from vlp.platform.finetune.run import BenchmarkReport, DownstreamReport

    reports = {"retrieval": BenchmarkReport("retrieval", {"ir_mean": 40.0, "tr_mean": 50.0,
                                                          "r_mean": 45.0}, 1, 0.0, "",
                                            primary=get_benchmark("retrieval").primary),
               "ve": BenchmarkReport("ve", {"ve_acc": 61.0}, 1, 0.0, "",
                                     primary=get_benchmark("ve").primary)}
    lines = DownstreamReport({"ir": 40.0, "tr": 50.0}, None, reports).lines()
    assert lines[:4] == ["ir 40.00", "tr 50.00", "retrieval 45.00", "ve 61.00"]


def test_refcoco_says_which_boxes_it_scored(setting):
    """vlp's detected boxes are the shard's own detector regions, not MAttNet's detections
    (the papers' val^d): the output says so, so its absolute score is not read as theirs."""
    family, data_cfg = setting
    for name, words in (("refcoco+", "not MAttNet's"), ("refcoco+-gt", "ground-truth")):
        bench = get_benchmark(name)
        ctx = BenchmarkContext(data_cfg, bench.options({}), family, "val", 0)
        data = bench.eval_data(ctx)
        answer = lambda b, right: np.where(b[K.REGION_MASK].bool().numpy(), 0.0, -1e4)  # noqa
        result = bench.evaluate(ctx, data, EvalRunner(Oracle(answer, True), batch_size=7))
        assert words in result.notes["boxes"]
