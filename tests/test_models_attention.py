"""CPU training's attention (``vlp.models.attention``): transformers' eager attention with
the scaling inside the GEMMs and the padding mask added in place, so it makes fewer passes
over the [B, heads, L, L] scores and gives eager's loss and gradients bit for bit (the same
dropout draws)."""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vlp.models import attention, create_model
from vlp.models.backbone import VLBackbone
from vlp.testing.example_batches import example_batch


# ops that make no pass over the data
VIEWS = {"view", "_unsafe_view", "transpose", "expand", "detach", "as_strided", "new_empty",
         "empty_like", "empty"}


class ScoreOps(TorchDispatchMode):
    """Counts the aten ops whose output has the scores' shape [B, heads, L, L] (or is their
    [B·heads, L, L] flat form), and the passes over such data among them."""

    def __init__(self, shapes):
        super().__init__()
        self.shapes, self.ops = shapes, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and tuple(out.shape) in self.shapes:
            self.ops[func.overloadpacket.__name__] += 1
        return out

    @property
    def passes(self) -> int:
        return sum(n for op, n in self.ops.items() if op not in VIEWS)


def step(model, batch, implementation=None, counter=None):
    """Loss and gradients of one training step; ``implementation`` forces the attention."""
    auto = VLBackbone._attention_for
    if implementation:
        VLBackbone._attention_for = lambda self, x, configured: implementation
    try:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        with counter or contextlib.nullcontext():
            loss = model(batch, task="mlm")["loss"]
            loss.backward()
    finally:
        VLBackbone._attention_for = auto
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("full", [False, True])
def test_cpu_training_attention_is_eager_bit_for_bit_with_fewer_passes(full):
    torch.manual_seed(0)
    model, spec, _ = create_model("uniter-tiny", tasks=["mlm"])
    model.train()
    batch = example_batch(spec, "mlm", batch_size=2, full_length=full)
    assert VLBackbone._attention_for(model.backbone, batch["input_ids"].float(),
                                     "sdpa") == attention.NAME
    t = model.family.transformer
    length = (batch["text_mask"].sum(1) + batch["region_mask"].sum(1)).max().item()
    shapes = {(2, t.num_heads, length, length), (2 * t.num_heads, length, length)}
    counts = {}
    for name in ("eager", None):
        counts[name] = ScoreOps(shapes)
        loss, grads = step(model, batch, name, counts[name])
        if name == "eager":
            eager_loss, eager_grads = loss, grads
    assert torch.equal(loss, eager_loss)
    assert eager_grads.keys() == grads.keys()
    for name, grad in eager_grads.items():
        assert torch.equal(grads[name], grad), name
    eager, ours = counts["eager"], counts[None]
    # eager scales the scores in the forward and their gradient in the backward (a pass
    # each), and adds the padding mask out of place; here the GEMMs scale and the mask is
    # added in place: two passes fewer per layer, the rest unchanged
    assert eager.passes - ours.passes == 2 * t.num_layers, (eager.ops, ours.ops)
    assert eager.ops["mul"] - ours.ops["mul"] == 2 * t.num_layers
    assert ours.ops["add"] == 0 and eager.ops["add"] == (0 if full else t.num_layers)
    assert ours.ops["add_"] == (0 if full else t.num_layers)
    assert ours.ops["_softmax"] == eager.ops["_softmax"] == t.num_layers
    assert ours.ops["bernoulli_"] == eager.ops["bernoulli_"] == t.num_layers
