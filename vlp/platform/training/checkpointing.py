"""Checkpoints for exact resume: the DeepSpeed checkpoint plus the trainer state.

Layout of one checkpoint folder (Ray merges what every rank writes into it)::

    vlp_trainer.json               rank 0: step, stage, tag, world size, ZeRO stage (read
                                   before the engine is built: it says which stage's engine
                                   to build, and with which ZeRO stage)
    latest, <tag>/...              DeepSpeed: module + optimizer partitions + LR scheduler,
                                   and the shared trainer state as ``client_state``
    vlp_rank_<r>.pt                each rank: its batch-source state and RNG states

Per-rank files are loaded with ``weights_only=True`` (safe by default).

Resume on another number of workers (N → M, ``world_change``): the global batch is kept,
``grad_accum`` × workers micro-batches a step, so ``grad_accum`` becomes a·N/M (refused in one
line where M does not divide a·N). DeepSpeed refuses a ZeRO optimizer state partitioned over
another data-parallel size, so a ZeRO checkpoint is converted once per worker to DeepSpeed's
universal checkpoint (``ds_to_universal``: a file per parameter with its fp32 weights and
Adam moments, into a temporary folder) and loaded from that into the M-way partition; an
optimizer state without ZeRO is whole in the module file and loads as it is. Every new rank
reads the N ranks' batch-source states and the source maps them to its own share
(``load_resharded_state``: a source whose example stream is global, each rank taking every
M-th micro-batch, continues at the global cursor with nothing skipped or repeated; a source
without it is refused). Per-rank RNG streams (dropout) are seeded anew from (seed, step,
rank): the loss curve then follows the uninterrupted run's within tolerance, not bitwise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from vlp.platform.training.deepspeed_import import load_deepspeed
from vlp.platform.training.loop_config import LoopConfig

META_FILE = "vlp_trainer.json"
CLIENT_STATE_KEY = "vlp_trainer"
# rank 0's ZeRO optimizer-state file in a DeepSpeed tag folder (DeepSpeed prefixes bf16_ in
# bf16); without ZeRO the optimizer state is inside mp_rank_00_model_states.pt
ZERO_STATE_FILES = ("zero_pp_rank_0_mp_rank_00_optim_states.pt",
                    "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")


def rank_file(rank: int) -> str:
    return f"vlp_rank_{rank:03d}.pt"


def step_tag(step: int) -> str:
    return f"step{step:08d}"


@dataclass
class TrainerState:
    """What, besides weights and optimizer, makes a resumed run continue exactly."""

    step: int = 0                   # optimizer steps done, over all stages
    stage: int = 0                  # index of the stage the engine belongs to
    examples_seen: int = 0          # global, all ranks
    input_units_seen: int = 0
    skipped_batches: int = 0        # dropped for a non-finite loss
    sampler: dict[str, Any] = field(default_factory=dict)
    mlflow_run_id: str | None = None
    world_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainerState:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


# ---- RNG ------------------------------------------------------------------------------------

def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """python, numpy and torch RNG states as weights_only-loadable values; on a GPU worker
    also the generator of *its own* device (``cuda``; Ray Train makes it the current device),
    never every visible GPU's: a resumed worker may land on a node with fewer GPUs."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                       float(cached)),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = _own_device_state(state.get("cuda"))
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda, torch.cuda.current_device())


def _own_device_state(saved: Any) -> torch.Tensor | None:
    """The saved CUDA generator state for this worker's device. Checkpoints before the
    per-device format hold a list with one state per GPU of the saving node (the worker's
    own at its local device index): take that index when the list has it, else none (the
    CUDA stream then continues from the run seed set before the model was built)."""
    if saved is None or isinstance(saved, torch.Tensor):
        return saved
    index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return saved[index] if index < len(saved) else None


# ---- save / load ----------------------------------------------------------------------------

def save(engine: Any, folder: str | Path, state: TrainerState, rank: int,
         batch_source_state: dict[str, Any], stages: list[tuple[str, int]] = ()) -> str:
    """Every rank calls this (DeepSpeed saves collectively). Returns the tag."""
    grad_accum = int(engine.gradient_accumulation_steps())
    folder = Path(folder)
    tag = step_tag(state.step)
    engine.save_checkpoint(str(folder), tag=tag,
                           client_state={CLIENT_STATE_KEY: state.to_dict()})
    torch.save({"batch_source": batch_source_state, "rng": rng_state()},
               folder / rank_file(rank))
    if rank == 0:
        meta = {"step": state.step, "stage": state.stage, "tag": tag,
                "stages": [[n, int(k)] for n, k in stages], "world_size": state.world_size,
                "examples_seen": state.examples_seen, "grad_accum": grad_accum,
                "zero_stage": int(engine.zero_optimization_stage())}
        if "stream" in batch_source_state:   # a pretraining stream: per_worker or global
            meta["stream"] = batch_source_state["stream"]
        (folder / META_FILE).write_text(json.dumps(meta, indent=1))
    return tag


def save_reported(engine: Any, state: TrainerState, rank: int,
                  batch_source_state: dict[str, Any], stages: list[tuple[str, int]],
                  reporter: Any, metrics: dict[str, Any], name: str) -> None:
    """A checkpoint written to a temporary folder and reported to Ray as ``name`` with
    ``metrics`` (``reporter.Reporter``); returns once Ray has persisted it, so that training
    goes on only from a checkpoint that exists."""
    with tempfile.TemporaryDirectory(prefix="vlp-ckpt-") as tmp:
        save(engine, tmp, state, rank, batch_source_state, stages=stages)
        reporter.submit(metrics, tmp, name)
        reporter.drain()


def read_meta(folder: str | Path) -> dict[str, Any]:
    """The trainer meta of the local checkpoint ``folder``, its ZeRO stage filled in."""
    path = Path(folder) / META_FILE
    if not path.exists():
        raise FileNotFoundError(f"{folder} is not a vlp pretraining checkpoint (no {META_FILE})")
    meta = json.loads(path.read_text())
    meta["zero_stage"] = saved_zero_stage(meta, lambda *parts: Path(folder, *parts).exists())
    return meta


def saved_zero_stage(meta: dict[str, Any], exists: Callable[..., bool]) -> int:
    """The ZeRO stage the checkpoint described by ``meta`` was written with; ``exists(tag,
    name)`` says whether its folder holds that file. The meta records it; a checkpoint from
    before it did (when one worker ran ZeRO-2 by default) tells by its files: a ZeRO
    optimizer-state file means ZeRO, taken as stage 2 (stages 1 and 2 write one format and
    load each other's), none means no ZeRO."""
    if "zero_stage" in meta:
        return int(meta["zero_stage"])
    return 2 if any(exists(meta["tag"], name) for name in ZERO_STATE_FILES) else 0


def world_change(meta: dict[str, Any], world_size: int, grad_accum: int
                 ) -> tuple[int, str | None]:
    """(``grad_accum`` for ``world_size`` workers resuming the checkpoint of ``meta``, why they
    cannot or None). The same number of workers keeps the config's ``grad_accum``; another
    keeps the checkpoint's global batch: its workers × its ``grad_accum`` micro-batches a step
    (a checkpoint from before the meta recorded it: the config's ``grad_accum``)."""
    saved_world = int(meta["world_size"])
    if saved_world == world_size:
        return grad_accum, None
    saved_gas = int(meta.get("grad_accum", grad_accum))
    micro = saved_world * saved_gas
    if micro % world_size:
        fits = [m for m in range(1, micro + 1) if micro % m == 0]
        return grad_accum, (
            f"the checkpoint to resume was written by {saved_world} workers × grad_accum "
            f"{saved_gas} = {micro} micro-batches a step, which {world_size} workers cannot "
            f"share evenly: resume on {', '.join(map(str, fits))} workers "
            f"(scaling.num_workers), or start a new run beside it with a new run.name (--name)")
    return micro // world_size, None


def stream_per_worker(saved_world: int, world_size: int, source: str) -> str:
    """The refusal of a resume on ``world_size`` workers of a checkpoint of ``saved_world``
    whose batch source keeps its position per worker."""
    return (f"the checkpoint to resume was written by {saved_world} workers; {source} keeps "
            f"its position per worker and cannot move it to {world_size} workers: resume on "
            f"{saved_world} workers (scaling.num_workers={saved_world}), or start a new run "
            f"beside it with a new run.name (--name)")


def follow_checkpoint(cfg: LoopConfig, meta: dict[str, Any], world_size: int | None = None
                      ) -> LoopConfig:
    """``cfg`` for a run resuming from ``meta`` (``saved_zero_stage`` filled in): where
    ``train.zero_stage`` is auto, the checkpoint's stage, for the rest of the run (its
    optimizer state loads only into an engine of the same kind: ZeRO or not). An explicit
    stage stays; ``resume_problem`` refuses one that cannot load it. On ``world_size`` workers
    other than the checkpoint's, ``grad_accum`` keeps its global batch (``world_change``)."""
    train = cfg.train
    if train.zero_stage == "auto":
        train = replace(train, zero_stage=meta["zero_stage"])
    if world_size is not None:
        gas, problem = world_change(meta, world_size, train.grad_accum)
        if problem:
            raise ValueError(problem)
        train = replace(train, grad_accum=gas)
    return cfg if train == cfg.train else replace(cfg, train=train)


def resume_problem(meta: dict[str, Any], stages: list[tuple[str, int]], world_size: int,
                   zero_stage: str | int = "auto", grad_accum: int = 1,
                   reshardable: bool = True, source: str = "this run's batch stream"
                   ) -> str | None:
    """Why the checkpoint described by ``meta`` cannot continue a run with these stages
    (name, steps) on ``world_size`` workers with ``train.zero_stage`` = ``zero_stage``; None
    if it can. Ray resumes every re-run with the same run name, so a changed experiment must
    be refused rather than trained as a mixture: the stages already done must be the same,
    the current one may only be lengthened or shortened to no less than the step reached (its
    schedule then follows the new length). DeepSpeed cannot load a ZeRO optimizer state into
    an engine without ZeRO or the reverse (a traceback from inside its loader), so that is
    refused here, naming the setting that resumes. Another worker count resumes where the
    checkpoint's global batch divides over it (``world_change``) and the batch source can move
    its position there (``reshardable``: the caller knows its ``source``, named in the
    refusal)."""
    k, step = meta["stage"], meta["step"]
    old = [tuple(s) for s in meta.get("stages", [])]
    new = [tuple(s) for s in stages]
    ends = [sum(s for _, s in new[:i + 1]) for i in range(len(new))]
    if (k >= len(new) or old[:k] != new[:k] or (old and old[k][0] != new[k][0])
            or step > ends[k]):
        return (f"the checkpoint to resume (step {step} in stage {k} of "
                f"{', '.join(f'{n}: {s}' for n, s in old) or '?'}) does not fit this config's "
                f"stages ({', '.join(f'{n}: {s}' for n, s in new)}): a re-run with the same "
                f"run.name resumes that job; give a changed experiment a new run.name")
    if meta["world_size"] != world_size and meta.get("stream") == "per_worker":
        # the saved positions are per worker, whatever this run's stream
        return stream_per_worker(meta["world_size"], world_size,
                                 "the checkpoint's batch stream (data.stream: per_worker)")
    if meta["world_size"] != world_size and not reshardable:
        return stream_per_worker(meta["world_size"], world_size, source)
    _, problem = world_change(meta, world_size, grad_accum)
    if problem:
        return problem
    saved = meta.get("zero_stage")
    if saved is not None and zero_stage != "auto" and (zero_stage > 0) != (saved > 0):
        held = "a ZeRO optimizer state" if saved else "an optimizer state without ZeRO"
        return (f"the checkpoint to resume was written with ZeRO stage {saved} and holds {held},"
                f" which train.zero_stage={zero_stage} cannot load: set "
                f"train.zero_stage={saved} (--set train.zero_stage={saved}) or auto (a resume "
                f"then follows the checkpoint)")
    return None


def latest_meta(run_dir: str | Path) -> dict[str, Any] | None:
    """The trainer meta of the newest vlp checkpoint in a Ray run folder, if any."""
    best = None
    for folder in Path(run_dir).glob("checkpoint_*"):
        if (folder / META_FILE).exists():
            meta = read_meta(folder)
            if best is None or meta["step"] > best["step"]:
                best = meta
    return best


def load(engine: Any, folder: str | Path, rank: int, world_size: int
         ) -> tuple[TrainerState, dict[str, Any]]:
    """Restore the engine; return the trainer state and this rank's batch-source state. RNG
    states are returned under ``"rng"`` for the caller to apply last (building things
    consumes randomness). On another number of workers than the checkpoint's the per-rank
    part holds every saved rank's batch-source state (``"batch_sources"``) and no RNG."""
    folder = Path(folder)
    meta = read_meta(folder)
    saved_world = int(meta["world_size"])
    with _loadable(engine, folder, meta, saved_world != world_size) as load_dir:
        load_path, client_state = engine.load_checkpoint(
            str(load_dir), tag=meta["tag"], load_module_strict=True, load_optimizer_states=True,
            load_lr_scheduler_states=True)
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {folder} (tag {meta['tag']})")
    state = TrainerState.from_dict(client_state[CLIENT_STATE_KEY])
    if saved_world == world_size:
        return state, torch.load(folder / rank_file(rank), weights_only=True)
    sources = []
    for r in range(saved_world):
        path = folder / rank_file(r)
        if not path.exists():
            raise FileNotFoundError(f"{folder}: {rank_file(r)} is missing; a checkpoint of "
                                    f"{saved_world} workers holds one per worker")
        sources.append(torch.load(path, weights_only=True)["batch_source"])
    state.world_size = world_size
    return state, {"batch_sources": sources, "rng": None}


@contextlib.contextmanager
def _loadable(engine: Any, folder: Path, meta: dict[str, Any], other_world: bool
              ) -> Iterator[Path]:
    """The folder DeepSpeed loads the checkpoint from: ``folder`` itself, or on another
    number of workers with a ZeRO optimizer state its universal conversion, in a temporary
    folder (gone after the load), the engine switched to DeepSpeed's universal loader for
    the load (``checkpoint.load_universal``: its config key, read only while loading)."""
    if not other_world or not engine.zero_optimization_stage():
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="vlp-universal-") as tmp:
        to_universal(folder / meta["tag"], Path(tmp) / meta["tag"])
        config = engine._config
        config.load_universal_checkpoint = True
        try:
            yield Path(tmp)
        finally:
            config.load_universal_checkpoint = False


def to_universal(tag_folder: Path, out: Path) -> None:
    """DeepSpeed's ``ds_to_universal`` of one checkpoint tag (ZeRO 1/2, bf16 or not) into
    ``out``: per parameter its fp32 weights and optimizer moments, whole. vlp's models record
    no tensor-parallel layout, which the converter then assumes absent
    (``inject_missing_state``); one extract worker (it runs beside training's workers). Its
    progress lines go to a buffer, shown only if it fails. Measured on CPU: a 2-rank ZeRO-1
    fp32 checkpoint loads on 1 rank with the same fp32 weights, Adam moments and step."""
    load_deepspeed()   # before any deepspeed import: deepspeed_import.py
    from deepspeed.checkpoint import ds_to_universal

    args = argparse.Namespace(input_folder=str(tag_folder), output_folder=str(out),
                              num_extract_workers=1, num_merge_workers=1,
                              keep_temp_folder=False, strict=True, inject_missing_state=True)
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            ds_to_universal.main(args)
    except Exception as e:
        raise RuntimeError(f"converting {tag_folder} to DeepSpeed's universal checkpoint "
                           f"failed: {e!r}; its output:\n{log.getvalue()[-2000:]}") from e
