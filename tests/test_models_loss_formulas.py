"""Each pretraining loss against its definition, computed here by hand from the encoder's
outputs and the task's own head: which positions count (masked, real, in a true pair), the
cross-entropy written out as logsumexp − target logit, ITM's column 1 = "match", and WRA's
sign, 1/B normalisation and 0.1 weight. (MRC, MRC-kl and MRFR have theirs in
test_models_tasks.py.)

Written to hold whatever the head's inner layers are (the heads are called, not rebuilt):
the VL-BERT RoI head and the WRA token rule may change on other branches; see the WRA test
for what it pins about the tokens."""

from __future__ import annotations

import pytest
import torch

from vlp.contract import batch_spec as bs
from vlp.models import create_model
from vlp.models.heads.retrieval import MatchScorer
from vlp.testing.example_batches import example_batch
from vlp.models.predict import predict

torch.set_num_threads(1)
POSITIVE = torch.tensor([True, True, False, False])


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over rows of logsumexp(logits) − logits[target]."""
    logits = logits.double()
    return (logits.logsumexp(-1) - logits.gather(1, target[:, None])[:, 0]).mean()


def soft_cross_entropy(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    logits = logits.double()
    return -(p.double() * (logits - logits.logsumexp(-1, keepdim=True))).sum(-1).mean()


def model_and_batch(family: str, task: str, **kwargs):
    torch.manual_seed(0)
    model, spec, _ = create_model(family, tasks=[task], **kwargs)
    model.eval()
    batch = example_batch(spec, task, batch_size=4)
    batch[bs.POSITIVE] = POSITIVE.clone()
    return model, batch


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-6)


def test_mlm_is_cross_entropy_over_masked_words_of_true_pairs():
    model, batch = model_and_batch("uniter-tiny", "mlm")
    labels = batch[bs.MLM_LABELS]
    assert (labels[2:] != -100).any() and (labels[:2] != -100).any()
    with torch.no_grad():
        out = model(batch, task="mlm")
        hidden = model.backbone(batch, pool=False).text_output()
        select = (labels != -100) & batch[bs.TEXT_MASK].bool() & POSITIVE[:, None]
        hand = cross_entropy(model.heads["mlm"](hidden[select]), labels[select])
    close(out["mlm_loss"], hand)
    close(out["loss"], hand)


def test_itm_column_one_means_match():
    model, batch = model_and_batch("uniter-tiny", "itm")
    head = model.heads["itm"]
    with torch.no_grad():        # a head that says "match" (column 1) for every pair
        head.weight.zero_()
        head.bias.copy_(torch.tensor([0.0, 4.0]))
        batch[bs.ITM_LABELS] = torch.tensor([1, 1, 1, 0])
        out = model(batch, task="itm")
        # CE with column 1 as the label 1: log(1 + e^-4) for the 3 matches, log(1 + e^4) once
        hand = (3 * torch.tensor(1 + torch.e ** -4.0).log()
                + torch.tensor(1 + torch.e ** 4.0).log()) / 4
        close(out["itm_loss"], hand)
        # curation and zero-shot retrieval read the same column as P(match) / log-odds
        score = predict(model, batch)["itm_score"]
        close(score, torch.full((4,), 1 / (1 + torch.e ** -4.0)))
        scorer = MatchScorer("retrieval", head.in_features, itm_head=head)
        close(scorer.out.bias, torch.tensor([4.0]))


def test_wra_is_itm_plus_a_tenth_of_the_signed_mean_ot_distance(monkeypatch):
    from vlp.tasks import wra

    model, batch = model_and_batch("uniter-tiny", "wra")
    labels = torch.tensor([1, 0, 1, 0])
    batch[bs.ITM_LABELS] = labels
    seen = {}
    real_plan = wra.ipot_plan

    def recording_plan(cost, x_valid, y_valid, *args, **kwargs):
        seen.update(x=x_valid.clone(), y=y_valid.clone())
        seen["plan"] = real_plan(cost, x_valid, y_valid, *args, **kwargs)
        return seen["plan"]

    monkeypatch.setattr(wra, "ipot_plan", recording_plan)
    with torch.no_grad():
        out = model(batch, task="wra")
        enc = model.backbone(batch, pool=True)
        itm = cross_entropy(model.heads["itm"](enc.pooled_output), labels)
    words, regions, plan = seen["x"], seen["y"], seen["plan"]
    # the tokens: every real word is in the plan, padding never; every real region, only those
    text_mask = batch[bs.TEXT_MASK].bool()
    lengths = text_mask.sum(1)
    assert not (words & ~text_mask).any()
    for b in range(4):
        assert words[b, 1:lengths[b] - 1].all()
    assert torch.equal(regions, batch[bs.REGION_MASK].bool())
    # the plan moves all the mass between those tokens (uniform marginals)
    close(plan.sum((1, 2)), torch.ones(4))
    close(plan.sum(2)[words], (1.0 / words.sum(1, keepdim=True).float()).expand_as(words)[words])
    # distance by hand: Σ_ij T_ij (1 − cos(word_i, region_j)); loss = 0.1 (Σ_pos − Σ_neg) / B
    t = torch.nn.functional.normalize(enc.text_output().double(), dim=-1)
    r = torch.nn.functional.normalize(enc.region_output().double(), dim=-1)
    cost = 1 - t @ r.transpose(1, 2)
    keep = words[:, :, None] & regions[:, None, :]
    distance = (cost * plan.double() * keep).sum((1, 2))
    assert (distance > 0).all()
    hand = 0.1 * (distance[labels == 1].sum() - distance[labels == 0].sum()) / 4
    close(out["wra_loss"], hand)
    close(out["itm_loss"], itm)
    close(out["loss"], itm + hand)


def test_moc_classifies_every_masked_region_of_true_pairs_zeroed_or_kept():
    model, batch = model_and_batch("imagebert-tiny", "moc")
    masked = batch[bs.REGION_MASKED] & batch[bs.REGION_MASK].bool()
    assert masked[:2].sum() >= 2 and masked[2:].any()
    # one masked region of a true pair kept as it was (MOC's 10 %)
    row, col = masked[:2].nonzero()[0].tolist()
    batch[bs.REGION_ZEROED][row, col] = False
    labels = batch[bs.REGION_CLASS_LABELS]
    with torch.no_grad():
        out = model(batch, task="moc")
        hidden = model.backbone(batch, pool=False).region_output()
        select = masked & POSITIVE[:, None]
        assert select[row, col]
        hand = cross_entropy(model.heads["moc"](hidden[select]), labels[select])
    close(out["moc_loss"], hand)


@pytest.mark.parametrize("soft", [True, False], ids=["soft-labels", "class-labels"])
def test_vlbert_masked_roi_loss(soft):
    model, batch = model_and_batch("vlbert-tiny", "mrc-vlbert")
    # the pipeline gives the detector's distribution (the reference's target) with the classes
    assert bs.REGION_SOFT_LABELS in batch and bs.REGION_CLASS_LABELS in batch
    if not soft:   # a batch without the distribution falls back to CE on the class
        del batch[bs.REGION_SOFT_LABELS]
    select = batch[bs.REGION_MASKED] & batch[bs.REGION_MASK].bool() & POSITIVE[:, None]
    assert select.any() and (batch[bs.REGION_MASKED][2:] & batch[bs.REGION_MASK][2:].bool()).any()
    with torch.no_grad():
        out = model(batch, task="mrc-vlbert")
        hidden = model.backbone(batch, pool=False).region_output()
        logits = model.heads["mrc_vlbert"](hidden[select])
        if soft:   # −Σ_c p_c log q_c with the detector's distribution p, over all C classes
            hand = soft_cross_entropy(logits, batch[bs.REGION_SOFT_LABELS][select])
        else:
            hand = cross_entropy(logits, batch[bs.REGION_CLASS_LABELS][select])
    close(out["mrc-vlbert_loss"], hand)


def test_mvm_is_cross_entropy_on_the_masked_cells_of_true_pairs():
    from vlp.models.embeddings.soho import MVM_LABELS

    model, batch = model_and_batch("soho-tiny", "mvm")
    # four images, one per pair, so the negatives' cells are their own
    g = torch.Generator().manual_seed(1)
    batch[bs.PIXELS] = torch.randn(4, *batch[bs.PIXELS].shape[1:], generator=g)
    batch[bs.PIXEL_MASK] = torch.ones(4, *batch[bs.PIXEL_MASK].shape[1:], dtype=torch.long)
    batch[bs.IMAGE_INDEX] = torch.arange(4)
    batch[bs.MVM_APPLY] = torch.ones(4, dtype=torch.bool)
    with torch.no_grad():
        torch.manual_seed(5)
        out = model(batch, task="mvm")
        torch.manual_seed(5)      # the same index drawn per image
        enc = model.backbone(batch, pool=False, visual_masking=True)
        labels = enc.extras[MVM_LABELS]
        assert (labels[2:] != -100).any()
        select = (labels != -100) & enc.region_mask & POSITIVE[:, None]
        # every masked cell of an image carries one dictionary index: the one masked
        for b in range(2):
            assert len(labels[b][labels[b] != -100].unique()) == 1
        hand = cross_entropy(model.heads["mvm"](enc.region_output()[select]), labels[select])
    close(out["mvm_loss"], hand)
