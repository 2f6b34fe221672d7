"""SNLI-VE (UNITER §4.1): the VQA head with 3 outputs on [CLS], cross-entropy; accuracy."""

from __future__ import annotations

from vlp.datasets.downstream.ve import VeData
from vlp.models.heads import build_head
from vlp.benchmarks.accuracy import expected_accuracy
from vlp.benchmarks.base import Benchmark, EvalResult, TrainDefaults, hidden_size, layer_norm_eps
from vlp.benchmarks.registry import register


@register
class Ve(Benchmark):
    name = "ve"
    table = "ve"
    description = "SNLI-VE: does the image entail, contradict or not decide the sentence"
    defaults = TrainDefaults(steps=500, batch_size=32, lr=1e-4)
    primary = "ve_acc"

    def train_data(self, ctx):
        return VeData(ctx.data, "train")

    def eval_data(self, ctx):
        return VeData(ctx.data, ctx.eval_split)

    def build_head(self, ctx, backbone, itm_head):
        return build_head("class-classifier", name=self.task, hidden=hidden_size(ctx),
                          num_classes=len(VeData.classes), eps=layer_norm_eps(ctx))

    def evaluate(self, ctx, data: VeData, runner) -> EvalResult | None:
        logits = runner.predict_sharded(data.batch, len(data))
        if logits is None:
            return None
        pred = logits.argmax(1)
        return EvalResult({"ve_acc": expected_accuracy(logits, data.labels)},
                          [{"id": i, "label": VeData.classes[p]}
                           for i, p in zip(data.column("id"), pred)])
