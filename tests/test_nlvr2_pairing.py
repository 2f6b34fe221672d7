"""NLVR2's two-sequence heads score each example from its own two images: the left image of
example i is never paired with the right image of another example (a pairing off by one row,
left of i with right of i−1, trains and scores on nonsense pairs and still runs).

Checked as permutation equivariance: the examples in another order give the same scores in
that order (exact up to float noise), and as locality: changing example j's right image
changes example j's score and no other."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.downstream import data_config_for
from vlp.datasets.downstream.nlvr2 import Nlvr2Data
from vlp.models import create_model
from vlp.models.heads import DownstreamModel, build_head

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cfg(tiny_world):
    _, spec, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64)
    return data_config_for(spec, str(tiny_world))


def model_for(variant: str) -> DownstreamModel:
    torch.manual_seed(0)
    base, _, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64,
                              overrides={"transformer.hidden_dropout": 0.0,
                                         "transformer.attention_dropout": 0.0})
    kw = {"num_heads": 4} if variant == "pair-biattn" else {}
    head = build_head(f"nlvr2-{variant}", name="t", hidden=64, **kw)
    return DownstreamModel(base.backbone, head).eval()


@pytest.mark.parametrize("variant", ["pair", "pair-biattn"])
def test_pair_heads_score_each_example_from_its_own_two_images(cfg, variant):
    data = Nlvr2Data(cfg, "train", variant)
    model = model_for(variant)
    idx = np.arange(6)
    perm = np.array([3, 0, 5, 1, 4, 2])
    with torch.no_grad():
        scores = model.predict(data.batch(idx))
        permuted = model.predict(data.batch(idx[perm]))
        assert scores.shape == (6, 2)
        torch.testing.assert_close(permuted, scores[perm], atol=1e-5, rtol=1e-5)
        # example 2's right image (row 5 of the 12 sequences) replaced by noise: only
        # example 2's score moves
        batch = data.batch(idx)
        feats = batch[K.REGION_FEATS].clone()
        feats[5] = torch.randn_like(feats[5]) * 3
        moved = model.predict({**batch, K.REGION_FEATS: feats})
    changed = (moved - scores).abs().amax(1) > 1e-6
    assert changed.tolist() == [False, False, True, False, False, False]
