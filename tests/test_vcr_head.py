"""VCR's head is UNITER A.2's: a two-class (right / wrong) classifier per (question, choice)
row, CE per row, choices ranked by P(right); the VCR benchmark builds it and scores by it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vlp.datasets.downstream import data_config_for
from vlp.contract import downstream_keys as D
from vlp.datasets.downstream.vcr import VcrData
from vlp.models import create_model
from vlp.models.heads import DownstreamModel, build_head, extend_for

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def vcr_model_and_batch(tiny_world):
    torch.manual_seed(0)
    base, spec, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64,
                                 overrides={"transformer.hidden_dropout": 0.0,
                                            "transformer.attention_dropout": 0.0})
    types = extend_for(base.backbone, "vcr")["vcr_types"]
    data = VcrData(data_config_for(spec, str(tiny_world)), "train", types)
    head = build_head("choice-pair-classifier", name="vcr", hidden=64)
    return DownstreamModel(base.backbone, head).eval(), data.batch(np.arange(3))


def test_head_is_uniters_two_class_mlp(vcr_model_and_batch):
    model, _ = vcr_model_and_batch
    kinds = [type(m).__name__ for m in model.head.mlp]
    assert kinds == ["Linear", "ReLU", "LayerNorm", "Linear"]
    assert (model.head.mlp[0].in_features, model.head.mlp[0].out_features) == (64, 128)
    assert model.head.mlp[-1].out_features == 2


def test_loss_is_ce_per_row_and_ranking_is_p_right(vcr_model_and_batch):
    model, batch = vcr_model_and_batch
    with torch.no_grad():
        logits = model.head.logits(model.backbone, batch)             # [rows, 2]
        out = model(batch, task="vcr")
        scores = model.predict(batch)
    groups = batch[D.LABELS].shape[0]
    assert logits.shape == (groups * 4, 2) and scores.shape == (groups, 4)
    right = torch.zeros(groups, 4, dtype=torch.long)
    right[torch.arange(groups), batch[D.LABELS]] = 1
    expect = F.cross_entropy(logits, right.reshape(-1))                # mean over rows
    assert float(out["vcr_loss"]) == pytest.approx(float(expect), rel=1e-5)
    torch.testing.assert_close(scores, logits.softmax(-1)[:, 1].view(groups, 4))
    # a softmax over the 4 choices would give a different loss on the same logits
    group_ce = F.cross_entropy(logits[:, 1].view(groups, 4), batch[D.LABELS])
    assert float(out["vcr_loss"]) != pytest.approx(float(group_ce), rel=1e-3)


def test_rows_are_independent(vcr_model_and_batch):
    """P(right) of a row depends on that row alone: the choices never compete (a softmax
    over the group would move every row's score when one row changes)."""
    model, batch = vcr_model_and_batch
    with torch.no_grad():
        before = model.predict(batch)
        changed = dict(batch)
        ids = batch["input_ids"].clone()
        ids[1, 1] = (ids[1, 1] + 7) % 100 + 1000                        # row 1 = group 0 choice 1
        changed["input_ids"] = ids
        after = model.predict(changed)
    assert not torch.allclose(after[0, 1], before[0, 1])
    keep = torch.ones_like(before, dtype=torch.bool)
    keep[0, 1] = False
    torch.testing.assert_close(after[keep], before[keep])


def test_vcr_benchmark_builds_the_pair_classifier():
    from vlp.models.heads.choice import ChoicePairClassifier
    from vlp.benchmarks import BenchmarkContext, get_benchmark

    base, _, _ = create_model("uniter-tiny", ["itm"])
    bench = get_benchmark("vcr")
    ctx = BenchmarkContext(data=None, options=bench.options({}), family=base.backbone.family)
    head = bench.build_head(ctx, base.backbone, None)
    assert isinstance(head, ChoicePairClassifier)
    assert base.backbone.text_embeddings.token_type_embeddings.num_embeddings == 4
