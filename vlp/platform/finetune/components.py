"""``FinetuneComponents``: the training loop's ``Components`` for finetuning one benchmark.

model = the pretrained backbone (or a fresh one) + the benchmark's head; batch source = the
benchmark's training batches, this rank's share of each shuffled epoch; task sampler = that
one task. After training, ``after_training`` evaluates on every worker (queries sharded by
rank, gathered on rank 0) and rank 0 writes the predictions file. Pickled into every Ray
Train worker, so it holds only plain, picklable settings.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vlp.datasets.downstream import EpochSampler
from vlp.datasets.stream.text_tokenizer import load_tokenizer
from vlp.models import create_model
from vlp.models.checkpoints import CheckpointError
from vlp.models.embeddings.soho import SohoEmbedder
from vlp.models.heads import DownstreamModel, build_head, extend_for
from vlp.platform.training import pretrained_weights as ckpt
from vlp.benchmarks import BenchmarkContext, get_benchmark
from vlp.benchmarks.eval_runner import EvalRunner


class SingleTask:
    """The task sampler of a finetune: always the benchmark."""

    def __init__(self, name: str):
        self.name = name

    def next(self) -> str:
        return self.name

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class FinetuneBatches:
    """This rank's training batches of one benchmark; resumable from two integers."""

    def __init__(self, data: Any, indices: np.ndarray, batch_size: int, seed: int,
                 rank: int, world_size: int):
        self.data, self.indices = data, indices
        self.seed, self.rank = seed, rank
        self.sampler = EpochSampler(len(indices), batch_size, seed, rank, world_size)

    def next(self, task: str) -> dict[str, torch.Tensor]:
        s = self.sampler
        # negatives (retrieval) drawn from a stream keyed by the batch's place in the run
        rng = np.random.default_rng([self.seed, self.rank, s.epoch, s.pos, 0xFE])
        return self.data.batch(self.indices[s.next()], rng)

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


@dataclass
class FinetuneComponents:
    benchmark: str
    ctx: BenchmarkContext
    init: str                      # "checkpoint" | "random" | "minilm"
    checkpoint: str = ""
    batch_size: int = 32
    eval_batch_size: int = 128
    dropout: float = 0.1
    predictions_dir: str = ""
    zero_shot: bool = False        # no head training: retrieval scored by the pretrained ITM
    visual_tokens: str = "features"   # SOHO: the VD module's input (§4.2) or its tokens
    dictionary_updates: bool = False  # SOHO: the dictionary's moving average while finetuning

    # ---- Components protocol --------------------------------------------------------------

    def datasets(self, cfg: Any) -> None:
        return None   # each worker reads its benchmark's Arrow tables itself (small, local)

    def build_model(self, cfg: Any, tasks: list[str]) -> DownstreamModel:
        bench = get_benchmark(self.benchmark)
        family = self.ctx.family
        vocab = load_tokenizer(self.ctx.data.tokenizer_path).vocab_size
        overrides = {"transformer.hidden_dropout": self.dropout,
                     "transformer.attention_dropout": self.dropout}
        base, _, _ = create_model(family.name, ["itm"],
                                  init="minilm" if self.init == "minilm" else "random",
                                  region_feat_dim=self.ctx.data.feature_dim or 2048,
                                  num_classes=2, vocab_size=vocab, overrides=overrides)
        itm = None
        if self.init == "checkpoint":
            weights = ckpt.read(self.checkpoint)
            ckpt.check_fits(weights, family.name, base.feat_dim, vocab)
            if ckpt.check_type_rows(weights, family.name, bench.name, bench.token_types):
                extend_for(base.backbone, bench.token_types)   # then the pretrained rows load
            ckpt.load_into(base, weights)
            if "heads.itm.weight" in weights.state:
                itm = base.heads["itm"]
        if self.zero_shot:
            if itm is None:
                raise CheckpointError(f"zero-shot retrieval scores with the pretrained ITM head; "
                                      f"{self.checkpoint} has none (pretrain with itm)")
            head = build_head("match-scorer", name=bench.task,
                              hidden=family.transformer.hidden_size, itm_head=itm)
        else:   # zero-shot scores the pretrained model as it was pre-trained
            head = bench.build_head(self.ctx, base.backbone, itm)
            for m in base.backbone.modules():
                if isinstance(m, SohoEmbedder):
                    m.set_finetune_input(self.visual_tokens, self.dictionary_updates)
        return DownstreamModel(base.backbone, head)

    def build_batch_source(self, cfg: Any, stage: Any, stage_index: int, worker: Any
                           ) -> FinetuneBatches:
        bench = get_benchmark(self.benchmark)
        data = bench.train_data(self.ctx)
        indices = bench.train_indices(data)
        return FinetuneBatches(data, indices, self.batch_size, self.ctx.seed, worker.rank,
                               worker.world_size)

    def build_task_sampler(self, mix: dict[str, float], seed: int) -> SingleTask:
        return SingleTask(get_benchmark(self.benchmark).task)

    # ---- evaluation (called by the loop on every worker once training completes) ----------

    def after_training(self, cfg: Any, model: torch.nn.Module, worker: Any) -> dict | None:
        bench = get_benchmark(self.benchmark)
        data = bench.eval_data(self.ctx)
        runner = EvalRunner(model, worker.rank, worker.world_size, self.eval_batch_size,
                            worker.device)
        result = bench.evaluate(self.ctx, data, runner)
        if result is None:      # not rank 0
            return None
        if bench.primary not in result.metrics:     # the headline every report reads
            raise RuntimeError(f"benchmark {self.benchmark}'s evaluation has no "
                               f"{bench.primary!r} (its primary metric); it reported "
                               f"{sorted(result.metrics)}")
        if runner.nonfinite:    # scored as nothing; said, so a diverged model's 0 is explained
            result.metrics["nonfinite_scores"] = float(runner.nonfinite)
            print(f"[finetune] {self.benchmark}: {runner.nonfinite} of the model's scores are "
                  f"NaN or ±inf; each ranks below every finite score and is never a hit",
                  flush=True)
        for key, note in result.notes.items():
            print(f"[finetune] {self.benchmark} {key}: {note}", flush=True)
        out = {"metrics": result.metrics, "primary": bench.primary, "notes": result.notes,
               "eval_split": self.ctx.eval_split,
               "eval_examples": len(data), "predictions": None}
        if self.predictions_dir:
            out["predictions"] = write_predictions(
                self.predictions_dir, f"{bench.task}-{self.ctx.eval_split}.json",
                {"benchmark": self.benchmark, "split": self.ctx.eval_split,
                 "metrics": result.metrics, "notes": result.notes,
                 "predictions": result.predictions})
        return out

    def with_(self, **changes) -> "FinetuneComponents":
        return dataclasses.replace(self, **changes)


def write_predictions(folder: str, name: str, obj: Any) -> str:
    """``obj`` as JSON in ``folder`` (a local folder or a storage URI: the run's storage, which
    the driver can read whichever node rank 0 ran on); atomic, so a finished-looking file is
    always complete. Returns the file's path or URI."""
    from vlp.platform.cluster.run_storage import open_location

    text = json.dumps(obj)          # before anything is written: a bad value writes nothing
    storage = open_location(folder)
    storage.write_text(text, name)
    return storage.uri(name)
