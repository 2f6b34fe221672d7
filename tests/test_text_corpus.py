"""Text-only MLM batches from a text corpus (VL-BERT's BooksCorpus + Wikipedia batches):
task mlm-text of the vlbert families reads data.text_corpus, batches carry no image, the
ranks split the lines, and the stream resumes exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.stream.data_config import DataConfig, DataConfigError, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches
from vlp.tasks import MaskContext
from vlp.datasets.batching.text_corpus import TextCorpusBatches
from vlp.datasets.stream.text_tokenizer import load_tokenizer
from vlp.models import create_model

torch.set_num_threads(1)
WORDS = "the quick brown fox jumps over a lazy dog near river bank under blue sky".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("books")
    rng = np.random.default_rng(0)
    for name in ("a.txt", "sub/b.txt"):
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        lines = [" ".join(rng.choice(WORDS, int(rng.integers(3, 20)))) for _ in range(60)]
        (d / name).write_text("\n".join(lines[:30] + [""] + lines[30:]) + "\n")
    return d


def _config(tiny_world, spec, corpus):
    return DataConfig.for_model(spec, (SourceConfig("coco", str(tiny_world / "images" / "coco")),),
                                batch_units=256, bucket_window=64,
                                text_corpus=None if corpus is None else str(corpus))


def test_mlm_text_needs_a_text_corpus(tiny_world, tmp_path):
    _, spec, _ = create_model("vlbert-tiny", ["mlm", "mlm-text"], region_feat_dim=64,
                              num_classes=17)
    with pytest.raises(DataConfigError, match="text_corpus: task mlm-text"):
        plan_data(_config(tiny_world, spec, None), ["mlm", "mlm-text"], model=spec)
    with pytest.raises(DataConfigError, match="no .txt files"):
        plan_data(_config(tiny_world, spec, tmp_path), ["mlm", "mlm-text"], model=spec)
    with pytest.raises(ValueError, match="does not apply"):
        create_model("uniter-tiny", ["mlm-text"])


def test_text_only_batches_train_vlbert(tiny_world, corpus):
    torch.manual_seed(0)
    model, spec, _ = create_model("vlbert-tiny", ["mlm", "mlm-text"], region_feat_dim=64,
                                  num_classes=17)
    plan = plan_data(_config(tiny_world, spec, corpus), ["mlm", "mlm-text"], model=spec)
    src = local_batches(plan)
    try:
        image_batch, text_batch = src.next("mlm"), src.next("mlm-text")
    finally:
        src.close()
    assert text_batch[K.REGION_FEATS].shape[1] == 0 and image_batch[K.REGION_FEATS].shape[1] > 0
    assert int(text_batch[K.INPUT_UNITS]) <= 256
    labels = text_batch[K.MLM_LABELS]
    assert (labels != -100).any(1).all()                      # every passage has a target
    tok = load_tokenizer(None)
    ids = torch.where(labels >= 0, labels, text_batch[K.INPUT_IDS])
    words = tok.decode(ids[0][text_batch[K.TEXT_MASK][0].bool()][1:-1]).split()
    assert words and set(words) <= set(WORDS)
    out = model(text_batch, task="mlm-text")
    assert set(out) == {"loss", "mlm-text_loss", "mlm-text_acc"}
    assert math.isfinite(float(out["loss"].detach()))
    out["loss"].backward()
    assert model.heads["mlm"].bias.grad.abs().sum() > 0      # the shared MLM head learns
    assert src.stats["text_only_batches"] == 1


def _corpus_batches(corpus, rank=0, world_size=1):
    tok = load_tokenizer(None)
    ctx = MaskContext(0.15, tok.mask_id, tok.cls_id, tok.sep_id, tok.random_ids)
    return TextCorpusBatches(str(corpus), tok, ctx, max_text_len=60, batch_units=128,
                             feature_dim=64, loc_dim=4, seed=3, rank=rank,
                             world_size=world_size)


def _epoch_rows(batches) -> list[tuple[int, ...]]:
    return [tuple(r.tolist()) for rows in batches._epoch_batches(0) for r in rows]


def test_ranks_split_the_lines_and_the_stream_resumes_exactly(corpus):
    whole = _epoch_rows(_corpus_batches(corpus))
    r0, r1 = _epoch_rows(_corpus_batches(corpus, 0, 2)), _epoch_rows(_corpus_batches(corpus, 1, 2))
    assert len(whole) == 120 and len(r0) == len(r1) == 60    # the blank line is skipped
    assert sorted(r0 + r1) == sorted(whole)                   # disjoint halves of the lines
    a = _corpus_batches(corpus)
    for _ in range(3):
        a.next()
    b = _corpus_batches(corpus)
    b.load_state_dict(a.state_dict())
    nxt_a, nxt_b = a.next(), b.next()
    assert nxt_a.keys() == nxt_b.keys()
    for k in nxt_a:
        torch.testing.assert_close(nxt_a[k], nxt_b[k])


def test_text_batches_take_one_fixed_shape_with_the_losses_of_unpadded(corpus):
    """``data.fixed_shapes`` for mlm-text: every batch is ``batch_units // width`` rows of the
    cap's width, padding rows and targets flagged; a padded batch's loss and gradients are
    those of the same passages unpadded."""
    from vlp.datasets.batching.fixed_shapes import ShapeSet, batch_signature, pad_to_shape

    tok = load_tokenizer(None)
    ctx = MaskContext(0.15, tok.mask_id, tok.cls_id, tok.sep_id, tok.random_ids)

    def batches(fixed):
        return TextCorpusBatches(str(corpus), tok, ctx, max_text_len=20, batch_units=128,
                                 feature_dim=64, loc_dim=4, seed=3, fixed_width=22 * fixed)

    fixed = batches(True)
    shapes = set()
    for _ in range(30):   # past an epoch's end (120 lines, 5 a batch)
        b = fixed.next()
        shapes.add(batch_signature(b))
        assert int(b[K.INPUT_UNITS]) == 5 * 22 and b[K.INPUT_IDS].shape == (5, 22)
        assert int(b[K.ROW_VALID].sum()) == int(b[K.NUM_EXAMPLES])
        assert b[K.MLM_TARGET_VALID].sum() == (b[K.MLM_LABELS] != -100).sum()
    assert len(shapes) == 1 and fixed.epoch == 1

    torch.manual_seed(0)
    model, _, _ = create_model("vlbert-tiny", ["mlm", "mlm-text"], region_feat_dim=64,
                               num_classes=17)
    model.eval()
    plain = batches(False).next()
    rows = len(plain[K.INPUT_IDS])
    arrays = {k: v.numpy().copy() for k, v in plain.items()}
    pad_to_shape(arrays, ShapeSet((rows + 2) * 22, (22,), 22, 0, 22, 0, 0.15))
    padded = {k: torch.from_numpy(v) if v.ndim else torch.tensor(v.item())
              for k, v in arrays.items()}
    assert padded[K.INPUT_IDS].shape == (rows + 2, 22)

    def loss_and_grads(batch):
        model.zero_grad(set_to_none=True)
        out = model(dict(batch), task="mlm-text")
        out["loss"].backward()
        return out["loss"].detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                      if p.grad is not None}

    want, want_grads = loss_and_grads(plain)
    got, got_grads = loss_and_grads(padded)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert got_grads.keys() == want_grads.keys()
    for n in want_grads:
        torch.testing.assert_close(got_grads[n], want_grads[n], rtol=1e-4, atol=1e-6, msg=n)
