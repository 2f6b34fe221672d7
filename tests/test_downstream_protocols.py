"""Each family's own downstream protocol (issue 39 item 1): the finetune recipe of each family
yields its paper's retrieval loss, NLVR2 head and RefCOCO+ head; the new losses equal their
formulas on hand-made examples; SOHO's in-batch groups are built from the mini-batch; the
protocol is shown in the finetune's printed lines and the leaderboard's header."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vlp.benchmarks.protocols import options_for, protocol_label
from vlp.contract import batch_spec as K
from vlp.contract import downstream_keys as D
from vlp.datasets.downstream import data_config_for
from vlp.datasets.downstream.retrieval import RetrievalData
from vlp.datasets.downstream.refexp import RefExpData
from vlp.models import create_model
from vlp.models.heads import DownstreamModel, build_head
from vlp.models.heads.refexp import NEG, per_roi_binary_loss
from vlp.models.heads.retrieval_losses import RETRIEVAL_LOSSES
from vlp.platform.finetune.finetune_config import load_finetune_config

torch.set_num_threads(1)

RECIPE = "jobs/configs/finetune.yaml"
# family → (retrieval loss, NLVR2 head, RefCOCO+ head), written from the papers by hand:
# UNITER §4.1 / §4.3 (Table 6); ImageBERT §5.3 (Table 4: binary only is best; no NLVR2 or
# RefCOCO+ reported: UNITER's); SOHO §4.2.1 (binary on in-batch pairs) and §4.2.3 (two [CLS],
# concatenated); VL-BERT §4.2.3 (a binary loss per RoI; no retrieval or NLVR2: UNITER's)
PAPERS = {
    "uniter-base": ("margin", "pair-biattn", "softmax"),
    "imagebert-base": ("binary", "pair-biattn", "softmax"),
    "soho-r101-l12": ("in-batch-binary", "pair", "softmax"),
    "vlbert-base": ("margin", "pair-biattn", "per-roi-binary"),
}


def recipe(family: str, *overrides: str):
    return load_finetune_config(RECIPE, [f"model.family={family}", "model.init=random",
                                         "model.checkpoint=", *overrides])


@pytest.mark.parametrize("family", sorted(PAPERS))
def test_each_familys_finetune_recipe_yields_its_papers_protocol(family):
    cfg = recipe(family)
    got = (cfg.options_for("retrieval").loss, cfg.options_for("nlvr2").variant,
           cfg.options_for("refcoco+").head)
    assert got == PAPERS[family]
    for bench, label in zip(("retrieval", "nlvr2", "refcoco+"), PAPERS[family]):
        # detected boxes: the label names which (the fallback, without MAttNet's import)
        boxes = ",boxes=shard-regions" if bench == "refcoco+" else ""
        assert cfg.protocol_of(bench)[0] == label + boxes
    # one protocol across families, on request; an option set in the config is taken as given
    uniter = recipe(family, "protocol=uniter")
    assert (uniter.options_for("retrieval").loss, uniter.options_for("nlvr2").variant,
            uniter.options_for("refcoco+").head) == PAPERS["uniter-base"]
    chosen = recipe(family, "settings.retrieval.options.loss=mce")
    assert chosen.protocol_of("retrieval") == ("mce", "set")


def test_protocol_sources_cite_the_paper_or_say_uniters():
    assert recipe("imagebert-tiny").protocol_of("retrieval") == ("binary", "ImageBERT §5.3")
    assert recipe("soho-tiny").protocol_of("nlvr2") == ("pair", "SOHO §4.2.3")
    assert recipe("vlbert-tiny").protocol_of("refcoco+") == ("per-roi-binary,boxes=shard-regions",
                                                            "VL-BERT §4.2.3")
    assert "reports none" in recipe("vlbert-tiny").protocol_of("retrieval")[1]
    assert recipe("vlbert-tiny", "protocol=uniter").protocol_of("refcoco+")[1].endswith(
        "(protocol: uniter)")
    assert options_for("vqa", "soho-tiny") == {}
    assert protocol_label({"retrieval": "binary", "nlvr2": "pair", "vqa": ""}) == \
        "nlvr2:pair retrieval:binary"


def test_in_batch_binary_refuses_mined_negatives():
    from vlp.contract.config_loader import ConfigError

    with pytest.raises(ConfigError, match="settings.retrieval.options.hard_negatives"):
        recipe("soho-tiny", "settings.retrieval.options.hard_negatives=true")


# ---- the losses on hand-made examples ------------------------------------------------------

def test_binary_and_in_batch_binary_losses_equal_the_mean_bce_over_pairs():
    # 3 images (groups) × 3 captions of the mini-batch; captions 0 and 2 share image 0, so
    # image 0's group holds two matches
    s = torch.tensor([[2.0, -1.0, 0.5], [1.5, 0.3, -2.0], [0.7, 0.1, -0.4]])
    y = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    p = 1 / (1 + np.exp(-s.numpy().astype(np.float64)))
    yn = y.numpy()
    by_hand = float(np.mean(-(yn * np.log(p) + (1 - yn) * np.log(1 - p))))
    for name in ("binary", "in-batch-binary"):
        assert float(RETRIEVAL_LOSSES[name](s, 0.2, y)) == pytest.approx(by_hand, rel=1e-6)


def test_per_roi_binary_loss_equals_the_mean_bce_over_real_regions():
    # 2 expressions, 4 region slots; expression 1 has 3 real regions (slot 3 is padding)
    s = torch.tensor([[1.0, -0.5, 2.0, 0.3], [0.2, 1.1, -0.7, NEG]])
    real = torch.tensor([[True, True, True, True], [True, True, True, False]])
    labels = torch.tensor([2, 1])
    terms = []
    for e in range(2):
        for j in range(4):
            if real[e, j]:
                p = 1 / (1 + np.exp(-float(s[e, j])))
                terms.append(-np.log(p) if j == labels[e] else -np.log(1 - p))
    assert float(per_roi_binary_loss(s, labels, real)) == pytest.approx(np.mean(terms), rel=1e-6)


# ---- SOHO's in-batch groups and VL-BERT's per-RoI head on the tiny world ------------------

@pytest.fixture(scope="module")
def cfg(tiny_world):
    _, spec, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64)
    return data_config_for(spec, str(tiny_world))


def test_in_batch_groups_pair_each_image_with_every_caption_of_the_batch(cfg):
    data = RetrievalData(cfg, "train", in_batch=True)
    t2i = data.text_to_image
    first = np.flatnonzero(t2i == t2i[0])[:2]             # two captions of one image
    other = np.flatnonzero(t2i != t2i[0])[:2]
    idx = np.concatenate([first, other])
    batch = data.batch(idx, np.random.default_rng(0))
    t = len(idx)
    assert int(batch[D.GROUP_SIZE]) == t and int(batch[K.NUM_EXAMPLES]) == t
    assert batch[K.INPUT_IDS].shape[0] == t * t
    labels = batch[D.MATCH_LABELS].numpy()
    want = np.array([[float(t2i[idx[j]] == t2i[idx[k]]) for j in [k] + [j for j in range(t)
                                                                    if j != k]]
                     for k in range(t)])
    np.testing.assert_array_equal(labels, want)
    assert labels[0].tolist() == [1.0, 1.0, 0.0, 0.0]     # the same image's other caption
    # the head trains on these labels: the loss is the binary loss of its scores
    torch.manual_seed(0)
    base, _, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64)
    head = build_head("match-scorer", name="r", hidden=64, loss="in-batch-binary")
    model = DownstreamModel(base.backbone, head).eval()
    out = model(batch, task="r")
    with torch.no_grad():
        scores = model.predict(batch).view(t, t)
    assert float(out["r_loss"].detach()) == pytest.approx(float(F.binary_cross_entropy_with_logits(
        scores, torch.as_tensor(want, dtype=torch.float32))), rel=1e-5)


def test_vlbert_recipe_builds_the_per_roi_binary_head(tiny_world):
    from vlp.platform.finetune.preflight import prepare
    from vlp.platform.finetune.run import components_for

    ft = load_finetune_config(data={"world": str(tiny_world), "benchmarks": ["refcoco+"],
                                    "mlflow": {"enabled": False},
                                    "model": {"family": "vlbert-tiny", "init": "random"}})
    _, _, _, options = ft.settings_for("refcoco+")
    comp = components_for(ft, "refcoco+", prepare(ft), 4, options)
    torch.manual_seed(0)
    model = comp.build_model(None, []).eval()
    assert model.head.loss_name == "per-roi-binary"
    data = RefExpData(comp.ctx.data, "train", "detected")
    batch = data.batch(data.labelled[:4])
    out = model(batch, task="refcocoplus")
    with torch.no_grad():
        scores, real = model.head.region_scores(model.backbone, batch)
    assert float(out["refcocoplus_loss"].detach()) == pytest.approx(float(per_roi_binary_loss(
        scores, batch[D.LABELS].long(), real)), rel=1e-5)
    assert float(out["refcocoplus_loss"].detach()) != pytest.approx(float(F.cross_entropy(
        scores, batch[D.LABELS].long())), rel=1e-3)


# ---- the protocol shown ------------------------------------------------------------------------

def test_the_finetunes_printed_lines_say_each_protocol():
    from vlp.platform.finetune.run import BenchmarkReport, DownstreamReport

    r = BenchmarkReport("retrieval", {"ir_mean": 50.0}, 4, 1.0, "", protocol="binary",
                        protocol_source="ImageBERT §5.3")
    v = BenchmarkReport("vqa", {"vqa_score": 40.0}, 4, 1.0, "")
    report = DownstreamReport({"ir": 50.0}, None, {"retrieval": r, "vqa": v})
    assert "retrieval.protocol binary (ImageBERT §5.3)" in report.lines()
    assert not any(line.startswith("vqa.protocol") for line in report.lines())
    assert report.protocols == {"retrieval": "binary"}


def row(trial, family, protocol):
    return SimpleNamespace(trial=trial, family=family, protocol=protocol)


def test_the_leaderboard_header_says_when_lines_mix_protocols():
    from vlp.platform.tracking.leaderboard_protocols import protocol_header

    same = protocol_header([row("L01", "uniter-tiny", "nlvr2:pair-biattn retrieval:margin"),
                            row("L02", "uniter-tiny", "nlvr2:pair-biattn retrieval:margin")])
    assert same == ["downstream protocol (every line): nlvr2:pair-biattn retrieval:margin; "
                    "family uniter-tiny"]
    mixed = protocol_header([row("a", "uniter-tiny", "retrieval:margin"),
                             row("b", "imagebert-tiny", "retrieval:binary"),
                             row("c", "uniter-tiny", "retrieval:margin")])
    assert mixed[0].startswith("WARNING: these lines mix downstream protocols")
    assert "  a, c: family uniter-tiny; protocol retrieval:margin" in mixed
    assert "  b: family imagebert-tiny; protocol retrieval:binary" in mixed
    # families compared under one protocol (protocol: uniter) are not a mix of protocols
    one = protocol_header([row("a", "uniter-tiny", "retrieval:margin"),
                           row("b", "imagebert-tiny", "retrieval:margin")])
    assert len(one) == 1 and "families imagebert-tiny, uniter-tiny" in one[0]
    # runs logged before the tag existed: not recorded, not assumed
    assert "not recorded" in protocol_header([row("a", "", "")])[0]


def test_the_sweeps_trials_are_tagged_with_their_protocol(tiny_world, tmp_path):
    from vlp.platform.sweep.sweep_config import load_sweep_config
    from vlp.platform.sweep.tracking import protocol_tags

    sweep = load_sweep_config("jobs/configs/sweep-tiny.yaml", [
        f"world={tiny_world}", f"sweep.output_dir={tmp_path}", "model.family=imagebert-tiny",
        "finetune.benchmarks=[retrieval,nlvr2]"])
    assert protocol_tags(sweep) == {"family": "imagebert-tiny",
                                    "downstream_protocol": "nlvr2:pair-biattn retrieval:binary"}


def test_the_new_losses_read_nothing_back_from_the_device():
    """What would make the host wait for a GPU (vlp.platform.training.host_syncs), none."""
    from vlp.platform.training.host_syncs import HostSyncRecorder

    s = torch.randn(4, 4, requires_grad=True)
    y = torch.eye(4)
    real = torch.tensor([[True] * 4, [True] * 3 + [False]] * 2)
    with HostSyncRecorder() as syncs:
        loss = (RETRIEVAL_LOSSES["in-batch-binary"](s, 0.2, y)
                + per_roi_binary_loss(s.masked_fill(~real, NEG), torch.tensor([0, 2, 1, 1]),
                                      real))
    loss.backward()
    assert not syncs.events, [f"{e.what} at {e.where}" for e in syncs.events]
