"""The pretraining config's ``train:`` section: how the steps run (objective, precision,
ZeRO, compile, batch building, non-finite losses), as ``TrainSection``.

Its own module so that the step's options can grow without the experiment config's file
(``experiment_config.py``, which holds it as ``ExperimentConfig.train``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vlp.contract.config_loader import ConfigModel


class TrainSection(ConfigModel):
    steps: int = Field(0, ge=0)         # optimizer steps; 0 = the sum of the stages' steps
    grad_accum: int = Field(1, gt=0)    # micro-batches per optimizer step
    # how a micro-batch trains the mix: "sampled" = one task drawn by mix ratio (UNITER);
    # "summed" = every task's loss on the same examples, one backward (VL-BERT's reference
    # code, ImageBERT, SOHO Eq. 9), the ratios as loss weights scaled to a mean of 1 (equal ratios: weight 1
    # each, the papers'; 2:2:1:1 → 4/3, 4/3, 2/3, 2/3); "" = the model family's paper's
    objective: Literal["", "sampled", "summed"] = ""
    # under summed: tasks that share one masked batch and one forward (each modality masked
    # once, by the group's first task of it); null = the family's paper's (VL-BERT: mlm,
    # mrc-vlbert and sirp, words and RoIs masked together; ImageBERT: moc and mrfr on one
    # masked region set); [] = every task its own batch and forward
    forward_groups: list[list[str]] | None = None
    # auto: bf16 on a CUDA device that supports it, fp32 (TF32 matmuls on CUDA) otherwise
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # auto: ZeRO-2 with several workers; one worker has nothing to partition: no ZeRO; a
    # resume: the checkpoint's stage (its optimizer state loads only into its kind)
    zero_stage: Literal["auto", 0, 1, 2] = "auto"
    # bf16 under ZeRO-1 on several ranks: the gradient all-reduce in buckets started during
    # the last micro-batch's backward (off: DeepSpeed's one reduction after it); buckets of
    # grad_bucket_elements (0: an eighth of the model, at least 1e6); the wire dtype (fp32:
    # the sum as DeepSpeed's; docs/cluster.md has the bf16 measurement)
    grad_overlap: bool = True
    grad_bucket_elements: int = Field(0, ge=0)
    grad_wire_dtype: Literal["fp32", "bf16"] = "fp32"
    # rank 0 times one all-reduce over the run's workers at start and prints its bus
    # bandwidth beside what the GPU's link / the instance's network should give, with a
    # warning when well below (vlp/platform/cluster/bus_bandwidth.py). auto: GPU runs of
    # more than one worker; true also runs it on CPU workers (gloo). interconnect_mb: the
    # buffer, 0 = 256 MiB on GPUs, 16 MiB on CPUs
    interconnect_check: Literal["auto", True, False] = "auto"
    interconnect_mb: int = Field(0, ge=0)
    activation_checkpointing: bool = False   # recompute encoder layers in the backward
    # torch.compile the model with static shapes, fullgraph (opt-in: with dynamic shapes the
    # encoder compiled took minutes and ran no faster on an H200, docs/gpu-check.md)
    compile: bool = False
    # the whole step captured per batch shape as a CUDA graph and replayed (opt-in; one
    # worker, bf16 under ZeRO-1, grad_accum 1: training/cuda_graph_step.py)
    cuda_graphs: bool = False
    prefetch_batches: int = Field(2, ge=0)   # micro-batches built ahead; 0 = off
    # where: a thread of the worker, or a process of their own (no GIL shared with the step's
    # dispatching; opt-in until the GPU check has timed it: docs/gpu-check.md)
    batch_builder: Literal["thread", "process"] = "thread"
    # how many (batch_builder: process): each builds its share of the batches, the batches
    # the same; each takes a core. auto: one per spare core, one building at first and one
    # more whenever the loop waits on data (docs/pretraining.md)
    batch_builders: int | Literal["auto"] = 1
    peak_tflops: float = Field(0.0, ge=0)    # device peak for MFU; 0 = from the device name
    log_every: int = Field(10, gt=0)    # steps between ray.train.report / MLflow flushes
    on_nonfinite: Literal["raise", "skip"] = "raise"   # a NaN/Inf loss on any rank
    max_nonfinite_skips: int = Field(10, gt=0)       # dropped batches per step, then raise
    stop_after: int = Field(0, ge=0)    # stop cleanly (with a checkpoint) at this step; 0 = off
    extensions_dir: str = ""              # TORCH_EXTENSIONS_DIR for DeepSpeed's JIT ops

    def validate(self):
        if self.batch_builders != "auto" and self.batch_builders < 1:
            yield "batch_builders", f"expected a count ≥ 1 or auto, got {self.batch_builders}"
        elif self.batch_builders != 1 and self.batch_builder != "process":
            yield "batch_builders", (f"is {self.batch_builders!r}, but batches are built on a "
                                     f"thread: set batch_builder: process (or leave 1)")
