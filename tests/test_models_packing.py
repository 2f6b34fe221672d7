"""The packed text+region row (SDPA) computes what a naive padded implementation computes.

The naive side concatenates the separately padded text and visual tokens (padding in the
middle), masks padded keys with −inf and runs the BERT layers by hand (matmul attention);
the outputs at every real token must match the packed model's outputs at that token's
packed position.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vlp.models import create_model
from vlp.testing.example_batches import example_batch
from vlp.models.packing import pack

torch.set_num_threads(1)


def naive_encoder(model, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    bias = torch.where(mask.bool(), 0.0, -math.inf)[:, None, None, :]
    for layer in model.backbone.encoder.layer:
        att = layer.attention.self
        heads, size = att.num_attention_heads, att.attention_head_size
        split = lambda x: x.view(*x.shape[:2], heads, size).transpose(1, 2)  # noqa: E731
        q, k, v = split(att.query(hidden)), split(att.key(hidden)), split(att.value(hidden))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(size) + bias, dim=-1)
        context = (probs @ v).transpose(1, 2).reshape(hidden.shape)
        out = layer.attention.output
        hidden = out.LayerNorm(out.dense(context) + hidden)
        inter = F.gelu(layer.intermediate.dense(hidden))
        hidden = layer.output.LayerNorm(layer.output.dense(inter) + hidden)
    return hidden


@pytest.mark.parametrize("family", ["uniter-tiny", "vlbert-tiny", "imagebert-tiny", "soho-tiny"])
def test_packed_row_equals_naive_padded(family):
    torch.manual_seed(0)
    model, spec, _ = create_model(family, tasks=["itm"])
    model.eval()
    batch = example_batch(spec, "itm", batch_size=5, seed=3)
    enc = model.encode(batch)

    inputs = model.backbone.visual(batch, model.backbone.text_embeddings)
    t = inputs.text.shape[1]
    hidden = naive_encoder(model, torch.cat([inputs.text, inputs.visual], 1),
                           torch.cat([inputs.text_mask, inputs.visual_mask], 1))
    n = inputs.num_regions
    text_ok, region_ok = inputs.text_mask, inputs.visual_mask[:, :n]
    torch.testing.assert_close(enc.text_output()[text_ok], hidden[:, :t][text_ok],
                               atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(enc.region_output()[region_ok], hidden[:, t:t + n][region_ok],
                               atol=2e-5, rtol=1e-4)
    # and no interior padding: every row is real tokens, then padding only
    lengths = text_ok.sum(1) + inputs.visual_mask.sum(1)
    assert torch.equal(enc.attention_mask.sum(1), lengths)
    assert enc.attention_mask.shape[1] == int(lengths.max())


def test_pack_places_text_then_regions_without_holes():
    text = torch.arange(1, 5.0).view(1, 4, 1).repeat(2, 1, 1)
    visual = torch.arange(10, 13.0).view(1, 3, 1).repeat(2, 1, 1)
    text_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    visual_mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    rows = pack(text, text_mask, visual, visual_mask)
    assert rows.embeddings[..., 0].tolist() == [[1, 2, 10, 11, 12], [1, 2, 3, 4, 10]]
    assert rows.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert rows.visual_positions.tolist() == [[2, 3, 4], [4, 0, 0]]


def test_encoder_runs_through_sdpa(monkeypatch):
    model, spec, _ = create_model("uniter-tiny", tasks=["itm"])
    assert model.backbone.bert_config._attn_implementation == "sdpa"
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("attn_mask"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    model.eval()
    model(example_batch(spec, "itm"), task="itm")
    assert len(calls) == model.family.transformer.num_layers
    assert calls[0] is not None and calls[0].dtype == torch.bool  # the padding mask reaches it
    calls.clear()
    model(example_batch(spec, "itm", full_length=True), task="itm")
    assert calls == [None] * model.family.transformer.num_layers  # no padding: no mask
    calls.clear()
    model.train()   # CPU training with attention dropout: eager attention (SDPA's math path
    model(example_batch(spec, "itm"), task="itm")   # costs more), the config left as it was
    assert calls == [] and model.backbone.bert_config._attn_implementation == "sdpa"


def test_eager_training_attention_matches_sdpa_with_the_same_dropout():
    from vlp.models.backbone import VLBackbone

    model, spec, _ = create_model("uniter-tiny", tasks=["mlm"])
    model.train()
    batch = example_batch(spec, "mlm", batch_size=3)

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        loss = model(batch, task="mlm")["loss"]
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                               if p.grad is not None}

    eager_loss, eager = loss_and_grads()
    auto = VLBackbone._attention_for
    try:
        VLBackbone._attention_for = lambda self, x, configured: configured   # SDPA always
        sdpa_loss, sdpa = loss_and_grads()
    finally:
        VLBackbone._attention_for = auto
    torch.testing.assert_close(eager_loss, sdpa_loss, rtol=1e-5, atol=1e-6)
    for name in sdpa:
        torch.testing.assert_close(eager[name], sdpa[name], rtol=1e-4, atol=1e-6, msg=name)
