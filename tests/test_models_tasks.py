"""Heads and losses: tying, shared heads, loss definitions, positive-pair rule, embeddings."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vlp.contract import batch_spec as bs
from vlp.models import create_model
from vlp.models.embeddings.vlbert import sine_box_geometry
from vlp.testing.example_batches import example_batch
from vlp.tasks.wra import ipot_plan

torch.set_num_threads(1)


def test_tied_weights_are_the_same_tensor():
    model, spec, _ = create_model("uniter-tiny", tasks=["mlm", "mrfr", "mrc", "mrc-kl", "itm"])
    words = model.backbone.text_embeddings.word_embeddings.weight
    assert model.heads["mlm"].decoder.weight is words
    assert model.heads["mrfr"].weight is model.backbone.visual.img_linear.weight
    # still tied after an optimiser step and a dtype round trip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(example_batch(spec, "mlm"), task="mlm")["loss"].backward()
    opt.step()
    model.double().float()
    words = model.backbone.text_embeddings.word_embeddings.weight
    assert model.heads["mlm"].decoder.weight is words
    ib, _, _ = create_model("imagebert-tiny", tasks=["mrfr"])
    assert ib.heads["mrfr"].weight is ib.backbone.visual.img_linear.weight


def test_tasks_that_share_a_head_share_it():
    model, _, _ = create_model("uniter-tiny", tasks=["mrc", "mrc-kl", "itm", "wra"])
    assert sorted(model.heads) == ["itm", "region_classifier"]


def _region_outputs(model, batch, task):
    enc = model.backbone(batch)
    select = batch[bs.REGION_MASKED] & enc.region_mask
    return model.heads["region_classifier"](enc.select_regions(select)), select


def test_mrc_kl_is_the_per_region_kl_averaged_over_regions():
    torch.manual_seed(0)
    model, spec, _ = create_model("uniter-tiny", tasks=["mrc-kl"], num_classes=9)
    model.eval()
    batch = example_batch(spec, "mrc-kl", batch_size=4)
    loss = model(batch, task="mrc-kl")["mrc-kl_loss"]
    logits, select = _region_outputs(model, batch, "mrc-kl")
    p, log_q = batch[bs.REGION_SOFT_LABELS][select], F.log_softmax(logits, -1)
    per_region = (p * (p.log() - log_q)).sum(-1)  # KL(p ‖ q) over all C classes
    torch.testing.assert_close(loss, per_region.mean())


def test_mrc_hard_label_excludes_background():
    model, spec, _ = create_model("uniter-tiny", tasks=["mrc"], num_classes=5)
    model.eval()
    batch = example_batch(spec, "mrc", batch_size=2)
    soft = torch.zeros(*batch[bs.REGION_MASK].shape, 5)   # the pipeline gives mrc no soft labels
    soft[..., 0], soft[..., 3] = 0.7, 0.3  # background most likely; class 3 is the label
    batch[bs.REGION_SOFT_LABELS] = soft
    derived = dict(batch)
    del derived[bs.REGION_CLASS_LABELS]
    logits, select = _region_outputs(model, batch, "mrc")
    expected = F.cross_entropy(logits, torch.full((int(select.sum()),), 3))
    torch.testing.assert_close(model(derived, task="mrc")["mrc_loss"], expected)


@pytest.mark.parametrize("reduction", ["sum-features", "mean-elements"])
def test_mrfr_regresses_raw_features_with_squared_l2(reduction):
    """sum-features (default): UNITER §3.2's Σᵢ‖h − r‖²₂ per masked region, mean over regions;
    mean-elements: the reference code's MSE (mean over regions × D)."""
    model, spec, _ = create_model("uniter-tiny", tasks=["mrfr"], region_feat_dim=16,
                                  overrides={"mrfr_reduction": reduction})
    model.eval()
    batch = example_batch(spec, "mrfr")
    enc = model.backbone(batch)
    select = batch[bs.REGION_MASKED] & enc.region_mask
    pred = model.heads["mrfr"](enc.select_regions(select))
    target = batch[bs.REGION_FEAT_TARGETS][select]
    assert target.abs().sum() > 0  # targets are the features before zeroing
    per_region = ((pred - target) ** 2).sum(-1)            # [M]: ‖h − r‖²₂
    expected = per_region.mean() if reduction == "sum-features" else per_region.mean() / 16
    torch.testing.assert_close(model(batch, task="mrfr")["mrfr_loss"], expected)


@pytest.mark.parametrize("family,task", [("uniter-tiny", "mlm"), ("uniter-tiny", "mrc-kl"),
                                         ("imagebert-tiny", "moc"), ("soho-tiny", "mvm")])
def test_masked_losses_count_only_positive_pairs(family, task):
    model, spec, _ = create_model(family, tasks=[task])
    model.eval()
    batch = example_batch(spec, task, batch_size=4)
    batch[bs.POSITIVE] = torch.tensor([True, True, False, False])
    if task == "mvm":   # the negative pairs get images of their own, so they can be changed
        g = torch.Generator().manual_seed(1)
        batch[bs.PIXELS] = torch.randn(4, *batch[bs.PIXELS].shape[1:], generator=g)
        batch[bs.PIXEL_MASK] = torch.ones(4, *batch[bs.PIXEL_MASK].shape[1:], dtype=torch.long)
        batch[bs.IMAGE_INDEX] = torch.arange(4)
        batch[bs.MVM_APPLY] = torch.ones(4, dtype=torch.bool)
    torch.manual_seed(0)
    loss = model(batch, task=task)["loss"]
    # the negative pairs' targets do not matter
    changed = dict(batch)
    if task == "mlm":
        labels = batch[bs.MLM_LABELS].clone()
        labels[2:][labels[2:] != -100] = 1999
        changed[bs.MLM_LABELS] = labels
    elif task == "mrc-kl":
        soft = batch[bs.REGION_SOFT_LABELS].clone()
        soft[2:] = soft[2:].flip(-1)
        changed[bs.REGION_SOFT_LABELS] = soft
    elif task == "moc":
        labels = batch[bs.REGION_CLASS_LABELS].clone()
        labels[2:][labels[2:] != -100] = 1
        changed[bs.REGION_CLASS_LABELS] = labels
    elif task == "mvm":  # other pixels: other dictionary cells masked and other labels
        pixels = batch[bs.PIXELS].clone()
        pixels[2:] = pixels[2:].flip(-1, -2) * 3
        changed[bs.PIXELS] = pixels
    torch.manual_seed(0)
    assert model(changed, task=task)["loss"] == loss
    # no positive pair at all: a finite zero that still backpropagates
    batch[bs.POSITIVE] = torch.zeros(4, dtype=torch.bool)
    model.train()
    out = model(batch, task=task)
    assert out["loss"] == 0
    out["loss"].backward()


def test_vlbert_masked_roi_feature_does_not_leak():
    model, spec, _ = create_model("vlbert-tiny", tasks=["mrc-vlbert"])
    model.eval()
    batch = example_batch(spec, "mrc-vlbert")
    out = model(batch, task="mrc-vlbert")["loss"]
    leaked = dict(batch)
    feats = batch[bs.REGION_FEATS].clone()
    feats[batch[bs.REGION_ZEROED]] = 5.0  # what the masked RoI really looked like
    leaked[bs.REGION_FEATS] = feats
    assert model(leaked, task="mrc-vlbert")["loss"] == out


def test_vlbert_geometry_embedding():
    boxes = torch.tensor([[0.1, 0.2, 0.5, 0.9]])
    g = sine_box_geometry(boxes, 2048)
    assert g.shape == (1, 2048)
    xc = (0.1 + 0.5) / 2 * 100
    assert g[0, 0].item() == pytest.approx(torch.tensor(xc).sin().item(), abs=1e-5)  # wave 0
    assert g[0, 256].item() == pytest.approx(torch.tensor(xc).cos().item(), abs=1e-5)


def test_uniter_region_embedding_formula_and_mask_embedding():
    model, spec, _ = create_model("uniter-tiny", tasks=["mrfr"], region_feat_dim=12)
    model.eval()
    v = model.backbone.visual
    with torch.no_grad():
        v.mask_embedding.weight[1].fill_(0.5)
    batch = example_batch(spec, "mrfr")
    inputs = v(batch, model.backbone.text_embeddings)
    zeroed = batch[bs.REGION_ZEROED]
    feats = batch[bs.REGION_FEATS] + zeroed[..., None].float() * 0.5
    expected = v.LayerNorm(v.img_layer_norm(v.img_linear(feats))
                           + v.pos_layer_norm(v.pos_linear(batch[bs.REGION_LOC]))
                           + model.backbone.text_embeddings.token_type_embeddings.weight[1])
    torch.testing.assert_close(inputs.visual, expected)
    # row 0 of the mask embedding stays zero through training
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model(batch, task="mrfr")["loss"].backward()
    opt.step()
    assert v.mask_embedding.weight[0].abs().sum() == 0


def test_ipot_plan_has_uniform_marginals():
    torch.manual_seed(0)
    cost = torch.rand(2, 5, 4)
    x_valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]).bool()
    y_valid = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool()
    plan = ipot_plan(cost, x_valid, y_valid)
    torch.testing.assert_close(plan.sum((1, 2)), torch.ones(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(plan[1].sum(1)[:3], torch.full((3,), 1 / 3), atol=1e-3, rtol=0)
    torch.testing.assert_close(plan[1].sum(0)[:2], torch.full((2,), 1 / 2), atol=1e-3, rtol=0)
    assert plan[1, 3:].abs().sum() == 0 and plan[1, :, 2:].abs().sum() == 0
    # cheap pairs get the mass
    diag = torch.ones(1, 3, 3) - torch.eye(3)
    plan = ipot_plan(diag, torch.ones(1, 3).bool(), torch.ones(1, 3).bool())
    assert torch.diagonal(plan[0]).sum() > 0.9
