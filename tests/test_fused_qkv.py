"""The fused query/key/value projection (vlp/models/fused_qkv.py): the encoder computes what
``transformers``' ``BertSelfAttention`` computes — loss and gradients, with dropout, for each
attention implementation the backbone uses — with the same parameters and names, and fewer
operations for the host to dispatch; a call with a key/value cache runs ``transformers``' own
forward. The encoder runs on flat rows ([B·L, hidden]) where every layer is fused."""

from __future__ import annotations

import collections
import inspect

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertSelfAttention

from vlp.models import create_model
from vlp.models.fused_qkv import FusedQKVSelfAttention, fuse_qkv, separate_qkv
from vlp.testing.example_batches import example_batch


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _step(model, batch, task: str, seed: int = 1):
    """Loss, gradients and (forward, backward) operation counts of one training step."""
    torch.manual_seed(seed)   # the same dropout draws for both
    model.zero_grad(set_to_none=True)
    with _Ops() as fwd:
        loss = model(batch, task=task)["loss"]
    with _Ops() as bwd:
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, (sum(fwd.n.values()), sum(bwd.n.values()))


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model, spec, _ = create_model("uniter-tiny", ["mlm", "itm"])
    batch = {k: torch.as_tensor(v) for k, v in example_batch(
        spec, "mlm", batch_size=6, text_len=12, num_regions=8, seed=3).items()}
    return model.train(), batch


def test_the_encoder_is_fused_by_default_with_transformers_parameters(tiny):
    model, _ = tiny
    attention = [m for m in model.modules() if isinstance(m, BertSelfAttention)]
    assert attention and all(type(m) is FusedQKVSelfAttention for m in attention)
    plain, _, _ = create_model("uniter-tiny", ["mlm", "itm"],
                               overrides={"transformer.fused_qkv": False})
    assert all(type(m) is BertSelfAttention for m in plain.modules()
               if isinstance(m, BertSelfAttention))
    # the same parameters, names and shapes: checkpoints and converted weights load as before
    assert {k: v.shape for k, v in model.state_dict().items()} == \
        {k: v.shape for k, v in plain.state_dict().items()}


@pytest.mark.parametrize("implementation", ["sdpa", "eager", "vlp_eager"])
def test_fused_trains_as_transformers_self_attention(tiny, implementation):
    model, batch = tiny
    model.backbone.bert_config._attn_implementation = implementation
    # keep the implementation for CPU training (the backbone would pick vlp_eager for sdpa)
    model.backbone._attention_for = lambda x, configured: configured
    try:
        loss, grads, ops = _step(model, batch, "mlm")
        layers = separate_qkv(model)
        want_loss, want_grads, want_ops = _step(model, batch, "mlm")
    finally:
        fuse_qkv(model)
        del model.backbone._attention_for
        model.backbone.bert_config._attn_implementation = "sdpa"
    assert layers == model.backbone.bert_config.num_hidden_layers
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=0)
    assert grads.keys() == want_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    # per layer: one linear, view, permute and unbind for three linears, views and
    # transposes; in the backward one product's gradients for three; and on flat rows no
    # view before and after the layer's other products, either way
    assert want_ops[0] - ops[0] >= 14 * layers, (ops, want_ops)
    assert want_ops[1] - ops[1] >= 24 * layers, (ops, want_ops)


def test_a_call_with_a_cache_runs_transformers_forward():
    from transformers.cache_utils import DynamicCache

    config = BertConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64,
                        attention_probs_dropout_prob=0.0, is_decoder=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    plain = BertSelfAttention(config, layer_idx=0).eval()
    fused = BertSelfAttention(config, layer_idx=0).eval()
    fused.load_state_dict(plain.state_dict())
    assert fuse_qkv(fused) == 1
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        torch.testing.assert_close(fused(x)[0], plain(x)[0], rtol=1e-5, atol=1e-6)
        # the cache keyword of this transformers' BertSelfAttention
        name = "cache" if "cache" in inspect.signature(plain.forward).parameters \
            else "past_key_values"
        caches = DynamicCache(config=config), DynamicCache(config=config)
        got = fused(x, **{name: caches[0]})[0]
        want = plain(x, **{name: caches[1]})[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert caches[0].get_seq_length() == caches[1].get_seq_length() == 5

    # flat rows, as the backbone hands them over: fused, and through the cache's fallback
    with torch.no_grad():
        flat = fused(x.view(10, 32), row_shape=(2, 5))[0]
        cache = DynamicCache(config=config)
        flat_cached = fused(x.view(10, 32), row_shape=(2, 5), **{name: cache})[0]
    assert flat.shape == flat_cached.shape == (10, 32)
    torch.testing.assert_close(flat, plain(x)[0].view(10, 32), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(flat_cached, want.view(10, 32), rtol=1e-5, atol=1e-6)
    assert cache.get_seq_length() == 5


def test_a_pretraining_config_can_run_transformers_projections():
    from types import SimpleNamespace

    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.init_weights_check import model_kwargs

    setup = SimpleNamespace(vocab_size=30522, preprocess=SimpleNamespace(vocab_size=30522),
                            family="uniter-tiny", tasks=("mlm",), feature_dim=64,
                            num_classes=21)
    for value, want in (("true", FusedQKVSelfAttention), ("false", BertSelfAttention)):
        cfg = load_experiment_config(data={"data": {"sources": {"a": {"path": "/x"}}},
                                           "tasks": {"mlm": 1}, "train": {"steps": 10},
                                           "optimizer": {"warmup_steps": 1}},
                                     overrides=[f"model.fused_qkv={value}"])
        model, _, _ = create_model(**model_kwargs(cfg.model, setup))
        assert {type(layer.attention.self) for layer in model.backbone.encoder.layer} == {want}
