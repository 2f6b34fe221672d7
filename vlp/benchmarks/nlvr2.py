"""NLVR2 (UNITER §4.3, Table 6): triplet, pair or pair-biattn; cross-entropy; accuracy.

The triplet layout extends the token-type table with a row for the second image, copied
from the image row (so the pretrained weights are untouched and the new row starts where
the model already reads regions)."""

from __future__ import annotations

from typing import Literal

from vlp.datasets.downstream.nlvr2 import Nlvr2Data
from vlp.contract.config_loader import ConfigModel
from vlp.models.heads import build_head, extend_for, layout_types
from vlp.benchmarks.accuracy import expected_accuracy
from vlp.benchmarks.base import Benchmark, EvalResult, TrainDefaults, hidden_size, layer_norm_eps
from vlp.benchmarks.registry import register


class Nlvr2Options(ConfigModel):
    # the protocol (vlp.benchmarks.protocols): UNITER's best; a family's finetune defaults to
    # its paper's (SOHO: pair)
    variant: Literal["triplet", "pair", "pair-biattn"] = "pair-biattn"


@register
class Nlvr2(Benchmark):
    name = "nlvr2"
    table = "nlvr2"
    description = "NLVR2: is the statement true of the image pair (accuracy)"
    defaults = TrainDefaults(steps=600, batch_size=32, lr=1e-4)
    Options = Nlvr2Options
    primary = "nlvr2_acc"
    protocol_option = "variant"

    def _data(self, ctx, split):
        types = (1, 2)
        if ctx.options.variant == "triplet":
            types = layout_types(ctx.family, "nlvr2-triplet")[1]["image_types"]
        return Nlvr2Data(ctx.data, split, ctx.options.variant, types)

    def check(self, ctx):
        if ctx.options.variant == "triplet":
            layout_types(ctx.family, "nlvr2-triplet")   # SOHO: one image per sequence

    def train_data(self, ctx):
        return self._data(ctx, "train")

    def eval_data(self, ctx):
        return self._data(ctx, ctx.eval_split)

    def build_head(self, ctx, backbone, itm_head):
        variant = ctx.options.variant
        kw = dict(name=self.task, hidden=hidden_size(ctx), eps=layer_norm_eps(ctx))
        if variant == "triplet":
            extend_for(backbone, "nlvr2-triplet")
        if variant == "pair-biattn":
            kw["num_heads"] = ctx.family.transformer.num_heads
        return build_head(f"nlvr2-{variant}", **kw)

    def evaluate(self, ctx, data: Nlvr2Data, runner) -> EvalResult | None:
        logits = runner.predict_sharded(data.batch, len(data))
        if logits is None:
            return None
        pred = logits.argmax(1)
        return EvalResult({"nlvr2_acc": expected_accuracy(logits, data.labels)},
                          [{"id": i, "label": bool(p)} for i, p in zip(data.column("id"), pred)])
