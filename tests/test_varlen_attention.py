"""Attention over the real tokens only (``transformer.attention: varlen``,
vlp/models/varlen_attention.py): with dropout off a tiny UNITER computes what the padded
attention computes (loss, every real token's output, every gradient) on rows of different
lengths; the nested-tensor path that CUDA runs equals the dense path a CPU runs; attention
dropout keeps UNITER's rate in training and is off in evaluation; the forward reads nothing
on the host; the segments' metadata is what the fused kernels need, read without a sync; a
combination that cannot work is refused in one line."""

from __future__ import annotations

import pytest
import torch

from vlp.contract import batch_spec as bs
from vlp.models import create_model, varlen_attention
from vlp.models.family_config import TransformerConfig
from vlp.platform.training.host_syncs import HostSyncRecorder
from vlp.testing.example_batches import example_batch


def _batch(spec, task: str, host_ints: bool, seed: int = 3) -> dict:
    batch = {k: torch.as_tensor(v) for k, v in example_batch(
        spec, task, batch_size=6, text_len=12, num_regions=8, seed=seed).items()}
    if host_ints:   # what the pretraining collate hands the model (the prefetcher's ints)
        lengths = batch[bs.TEXT_MASK].sum(1) + batch[bs.REGION_MASK].sum(1)
        batch[bs.ROW_LENGTH] = int(lengths.max())
        batch[bs.REAL_UNITS] = int(lengths.sum())
    return batch


def _no_dropout(model):
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model.backbone.bert_config.attention_probs_dropout_prob = 0.0
    model.backbone.bert_config.hidden_dropout_prob = 0.0
    return model


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    padded, spec, _ = create_model("uniter-tiny", ["mlm", "itm", "mrfr"])
    varlen, _, _ = create_model("uniter-tiny", ["mlm", "itm", "mrfr"],
                                overrides={"transformer.attention": "varlen"})
    varlen.load_state_dict(padded.state_dict())
    return padded, varlen, spec


def _step(model, batch, task):
    model.zero_grad(set_to_none=True)
    captured = {}
    handle = model.backbone.register_forward_hook(
        lambda mod, args, out: captured.setdefault("out", out))
    try:
        loss = model(batch, task=task)["loss"]
    finally:
        handle.remove()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), captured["out"], grads


@pytest.mark.parametrize("task", ["mlm", "itm", "mrfr"])
@pytest.mark.parametrize("host_ints", [False, True])
def test_varlen_equals_padded_attention_without_dropout(pair, task, host_ints):
    padded, varlen, spec = pair
    assert varlen.backbone.bert_config._attn_implementation == varlen_attention.NAME
    batch = _batch(spec, task, host_ints)
    lengths = batch[bs.TEXT_MASK].sum(1) + batch[bs.REGION_MASK].sum(1)
    assert len(set(lengths.tolist())) > 2   # rows of different lengths
    results = [_step(_no_dropout(m.train()), batch, task) for m in (padded, varlen)]
    (loss_p, out_p, grads_p), (loss_v, out_v, grads_v) = results
    torch.testing.assert_close(loss_v, loss_p, rtol=1e-5, atol=1e-6)
    # one spare padding slot per row; every real token's output is the padded kernel's
    assert out_v.sequence_output.shape[1] == out_p.sequence_output.shape[1] + 1
    real = out_p.attention_mask.bool()
    width = real.shape[1]
    torch.testing.assert_close(out_v.sequence_output[:, :width][real],
                               out_p.sequence_output[real], rtol=1e-5, atol=1e-5)
    assert grads_v.keys() == grads_p.keys()
    for name, g in grads_p.items():
        torch.testing.assert_close(grads_v[name], g, rtol=1e-4, atol=1e-6, msg=name)


def _qkv(b=4, heads=2, w=24, d=16, seed=0):
    """q, k, v as fused_qkv hands them over: views of one [B, W, 3, heads, d] projection."""
    g = torch.Generator().manual_seed(seed)
    buf = torch.randn(b, w, 3, heads, d, generator=g, requires_grad=True)
    return buf, buf.permute(2, 0, 3, 1, 4).unbind(0)


def _mask(lengths, w):
    return (torch.arange(w)[None] < torch.tensor(lengths)[:, None]).long()


def test_the_nested_path_cuda_runs_equals_the_dense_path_on_a_cpu():
    lengths = [5, 23, 11, 1]          # W = 24: the longest row keeps one spare slot
    mask = _mask(lengths, 24)
    buf, (q, k, v) = _qkv()
    seg_dense = varlen_attention.segments(mask, torch.bool)
    seg = varlen_attention.segments(mask)
    assert seg.offsets.tolist() == [0, 5, 24, 47, 48, 59, 72, 73, 96]
    real = mask.bool()
    scale = 0.25
    dense = varlen_attention.dense_attention(None, q, k, v, seg_dense, scale, 0.0)
    nested = varlen_attention.nested_attention(q, k, v, seg, scale, 0.0)
    assert nested.shape == dense.shape == (4, 24, 2, 16)
    # outside their segment nothing: the padded kernel's result for every real token
    padded = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=real[:, None, None, :], scale=scale).transpose(1, 2)
    torch.testing.assert_close(nested[real], padded[real])
    torch.testing.assert_close(dense, nested)   # padding tokens too: among themselves
    weight = torch.randn(nested.shape) * real[:, :, None, None]   # a loss of real tokens
    g_nested, = torch.autograd.grad((nested * weight).sum(), buf)
    g_dense, = torch.autograd.grad((dense * weight).sum(), buf)
    g_padded, = torch.autograd.grad((padded * weight).sum(), buf)
    torch.testing.assert_close(g_nested, g_dense)
    torch.testing.assert_close(g_nested, g_padded)


def test_a_row_without_real_tokens_keeps_every_segment_non_empty():
    """A fixed-shape batch's padding row (data.fixed_shapes: zero masks) has no real token;
    its first segment is one token all the same, so the fused kernels' condition holds and
    the row's values stay finite; the other rows are untouched."""
    mask = _mask([0, 7, 15], 16)
    seg = varlen_attention.segments(mask)
    assert seg.offsets.tolist() == [0, 1, 16, 23, 32, 47, 48]
    buf, (q, k, v) = _qkv(b=3, w=16)
    nested = varlen_attention.nested_attention(q, k, v, seg, 0.25, 0.0)
    dense = varlen_attention.dense_attention(
        None, q, k, v, varlen_attention.segments(mask, torch.bool), 0.25, 0.0)
    assert torch.isfinite(nested).all()
    torch.testing.assert_close(dense, nested)
    real = mask.bool()
    padded = torch.nn.functional.scaled_dot_product_attention(
        q[1:], k[1:], v[1:], attn_mask=real[1:, None, None, :], scale=0.25).transpose(1, 2)
    torch.testing.assert_close(nested[1:][real[1:]], padded[real[1:]])


def _dropout_share(out: torch.Tensor, lengths: list[int], p: float):
    """With q = k = 0 and v the identity over positions, ``out[b, i, h, j]`` is query i's
    weight on key j after dropout: 1 / (n (1 - p)) or 0 inside i's segment of length n, 0
    outside. Returns (the share dropped inside the segments, the largest weight outside)."""
    dropped, total, outside = 0, 0, 0.0
    for b, n in enumerate(lengths):
        w = out.shape[1]
        inside = out[b, :n, :, :n]
        kept = torch.isclose(inside, torch.tensor(1.0 / (n * (1 - p))))
        assert bool((kept | (inside == 0)).all())
        dropped += int((inside == 0).sum())
        total += inside.numel()
        outside = max(outside, float(out[b, :n, :, n:].abs().max()) if n < w else 0.0)
    return dropped / total, outside


@pytest.mark.parametrize("path", ["dense_eager", "dense_sdpa", "nested"])
def test_attention_dropout_keeps_its_rate(path):
    p, b, heads, w = 0.1, 6, 4, 40
    lengths = [39, 30, 21, 12, 35, 7]
    mask = _mask(lengths, w)
    q = k = torch.zeros(b, heads, w, w)
    v = torch.eye(w).expand(b, heads, w, w)
    torch.manual_seed(0)
    module = torch.nn.Module().train()
    if path == "nested":
        out = varlen_attention.nested_attention(q, k, v, varlen_attention.segments(mask),
                                                1.0, p)
    else:
        dtype = torch.float32 if path == "dense_eager" else torch.bool
        out = varlen_attention.dense_attention(
            module, q, k, v, varlen_attention.segments(mask, dtype), 1.0, p)
    share, outside = _dropout_share(out, lengths, p)
    n = b * heads * sum(x * x for x in lengths)      # ≈ 21k draws: sd of the share ≈ 0.002
    assert abs(share - p) < 4 * (p * (1 - p) / n) ** 0.5 + 1e-3, share
    assert outside == 0.0


def test_the_model_passes_uniters_attention_dropout_in_training_only(monkeypatch):
    seen = []
    dense = varlen_attention.dense_attention

    def spy(module, q, k, v, seg, scaling, dropout):
        seen.append(dropout)
        return dense(module, q, k, v, seg, scaling, dropout)

    monkeypatch.setattr(varlen_attention, "dense_attention", spy)
    torch.manual_seed(0)
    model, spec, _ = create_model("uniter-tiny", ["mlm"],
                                  overrides={"transformer.attention": "varlen",
                                             "transformer.attention_dropout": 0.1})
    batch = _batch(spec, "mlm", host_ints=True)
    model.train()(batch, task="mlm")
    layers = model.backbone.bert_config.num_hidden_layers
    assert seen == [0.1] * layers
    seen.clear()
    with torch.no_grad():
        model.eval()(batch, task="mlm")
    assert seen == [0.0] * layers


@pytest.mark.parametrize("task", ["mlm", "itm"])
def test_the_varlen_encoder_reads_nothing_on_the_host(pair, task):
    """The backbone's forward and backward (the tasks' losses are test_forward_host_syncs.py's,
    on the loop's batches)."""
    _, varlen, spec = pair
    batch = _batch(spec, task, host_ints=True)
    varlen.train()
    with HostSyncRecorder() as syncs:
        out = varlen.backbone(batch, pool=True)
        (out.sequence_output.sum() + out.pooled_output.sum()).backward()
    assert not syncs.events, syncs.describe()


def test_the_fused_kernels_get_their_metadata_without_a_host_sync():
    """What SDPA on nested tensors hands CUDA's variable-length kernels, prepared on a CPU:
    ``cu_seqlens`` = the segments' offsets (int32), ``max_seqlen`` = W, the buffers in place
    (no copy of fused_qkv's strided views), no empty segment (the kernels' condition), and
    no value read on the host on the way."""
    sdpa = pytest.importorskip("torch.nested._internal.sdpa")
    if not hasattr(sdpa, "_sdpa_nested_preprocessing"):
        pytest.skip("this torch prepares nested SDPA elsewhere")
    lengths = [5, 23, 11, 1]
    mask = _mask(lengths, 24)
    buf, (q, k, v) = _qkv(d=64)
    seg = varlen_attention.segments(mask)
    with HostSyncRecorder() as syncs:
        nq, nk, nv = (varlen_attention._jagged(x, seg, contiguous=False) for x in (q, k, v))
        (q_buf, k_buf, v_buf, cu_q, cu_k, max_q, max_k, _) = \
            sdpa._sdpa_nested_preprocessing(nq, nk, nv)
        params = torch.backends.cuda.SDPAParams(nq, nk, nv, None, 0.1, False, False)
        flash_ok = sdpa._can_use_flash_sdpa_jagged(params, debug=True)
        efficient_ok = sdpa._can_use_efficient_sdpa_jagged(params, debug=True)
    assert not syncs.events, syncs.describe()
    assert flash_ok and efficient_ok
    assert cu_q.dtype == torch.int32 and cu_q.tolist() == seg.offsets.tolist()
    assert torch.equal(cu_k, cu_q) and max_q == max_k == 24
    for flat, x in ((q_buf, q), (k_buf, k), (v_buf, v)):
        assert flat.shape == (4 * 24, 2, 64)
        assert flat.data_ptr() == x.data_ptr()   # the projection's buffer itself
        torch.testing.assert_close(flat.view(4, 24, 2, 64), x.transpose(1, 2))


def test_refusals_are_one_line():
    base = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    with pytest.raises(ValueError, match="cannot be combined with "
                                         "transformer.attn_implementation='eager'") as e:
        TransformerConfig(**base, attention="varlen", attn_implementation="eager")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"transformer.attention='ragged': expected one of"):
        TransformerConfig(**base, attention="ragged")
    with pytest.raises(TypeError, match="expected the backbone's Segments"):
        q = torch.zeros(1, 2, 3, 4)
        varlen_attention.vlp_varlen_attention(torch.nn.Module(), q, q, q, None)
    model, _, _ = create_model("uniter-tiny", ["mlm"],
                               overrides={"transformer.attn_implementation": "eager"})
    with pytest.raises(ValueError, match="cannot be combined with attn_implementation='eager'"):
        model.backbone.set_attention_layout("varlen")


def test_the_experiment_config_names_the_layout():
    from vlp.platform.pretrain.experiment_config import ModelSection
    from vlp.platform.pretrain.init_weights_check import model_kwargs

    assert ModelSection().attention == "padded"
    with pytest.raises(Exception, match="attention"):
        ModelSection(attention="ragged")

    class Setup:
        vocab_size = 30522
        preprocess = type("P", (), {"vocab_size": 30522})()
        family, tasks, feature_dim, num_classes = "uniter-tiny", ("mlm",), 64, 17

    kwargs = model_kwargs(ModelSection(attention="varlen"), Setup())
    assert kwargs["overrides"]["transformer.attention"] == "varlen"


def test_activation_checkpointing_recomputes_through_varlen(pair):
    """The backward's recompute (``train.activation_checkpointing``) runs after the forward
    returned: the layers still read varlen's implementation from the shared config."""
    _, varlen, spec = pair
    batch = _batch(spec, "mlm", host_ints=True)
    model = _no_dropout(varlen.train())
    loss, _, grads = _step(model, batch, "mlm")
    model.backbone.set_activation_checkpointing(True)
    try:
        loss_c, _, grads_c = _step(model, batch, "mlm")
    finally:
        model.backbone.set_activation_checkpointing(False)
    torch.testing.assert_close(loss_c, loss)
    for name, g in grads.items():
        torch.testing.assert_close(grads_c[name], g, msg=name)


def test_the_gpu_checks_varlen_variant_puts_padded_back():
    """The GPU check's steady variant (vlp/platform/gpu_check/timing.py) switches the
    model's backbone to varlen for its pass and back after it, an error included."""
    from vlp.platform.gpu_check import timing

    model, _, _ = create_model("uniter-tiny", ["mlm"])
    backbones = timing._padded_backbones(model)
    assert backbones == [model.backbone]

    def during():
        assert model.backbone.attention_layout == "varlen"
        assert model.backbone.bert_config._attn_implementation == varlen_attention.NAME
        raise RuntimeError("a failed pass")

    with pytest.raises(RuntimeError, match="a failed pass"):
        timing._with_varlen(backbones, during)
    assert model.backbone.attention_layout == "padded"
    assert model.backbone.bert_config._attn_implementation == "sdpa"
    model.backbone.set_attention_layout("varlen")
    assert timing._padded_backbones(model) == []   # configured varlen: no such variant
