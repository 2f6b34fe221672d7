"""From a point of the space to the configs a trial runs: the pretraining experiment config
(``vlp.platform.pretrain.job``) and the finetune settings (``vlp.platform.finetune``).

    cfg = pretrain_config(sweep_cfg, point, trial="L10", trial_dir="/abs/sweep/trials/L10")
    kw = finetune_kwargs(sweep_cfg, point, checkpoint, "vqa", trial="L10", trial_dir=...)

This is the sweep as "a function that yields configs": ``configs_of`` yields every trial's
pretraining config of a replay, and the preflight builds and checks each of them before any
trial starts.
"""

from __future__ import annotations

import copy
import posixpath
from pathlib import Path
from typing import Any, Iterator

from vlp.platform.pretrain.experiment_config import ExperimentConfig
from vlp.platform.sweep.sweep_config import SweepConfig
from vlp.platform.sweep.point import TrialPoint

DOMAIN_OF_CHOICE = {"in": ("in",), "out": ("out",), "both": ("in", "out")}


def data_sources(world: str, choice: str) -> dict[str, dict[str, Any]]:
    """The world's pretraining sources for a data choice (in / out / both), by the domains
    its manifest records."""
    from vlp.datasets.storage.world import load_manifest

    m = load_manifest(world, check_files=False)
    names = [n for d in DOMAIN_OF_CHOICE[choice] for n in m.pretraining_sources(d)]
    return {n: {"path": str(m.path(m.sources[n].folder))} for n in names}


def pretrain_config(cfg: SweepConfig, point: TrialPoint, *, trial: str,
                    trial_dir: str, seed: int | None = None) -> ExperimentConfig:
    """The pretraining job of ``point``: the sweep's shared ``pretrain`` sections plus what the
    point decides. ``seed``: the replicate's training seed (default ``sweep.seed``).
    Validated against the model registry (``load_pretrain_config``)."""
    from vlp.platform.pretrain.job import load_pretrain_config

    if not point.pretrains:
        raise ValueError(f"trial {trial}: the point {point.describe()} does not pretrain")
    data = copy.deepcopy(cfg.pretrain)
    # storage: the trial's own folder (in the sweep's storage), never $VLP_STORAGE's root
    # (trial names repeat across sweeps, and the same storage + name resumes a run)
    data["run"] = {**data.get("run", {}), "name": f"{trial}-pretrain",
                   "output_dir": local_dir(cfg, trial_dir), "storage": trial_dir,
                   "seed": cfg.sweep.seed if seed is None else seed}
    data["model"] = {**data.get("model", {}), "family": cfg.model.family, **model_init(cfg, point)}
    data["data"] = {**data.get("data", {}), "sources": data_sources(cfg.world, point.data),
                    "masking": point.masking}
    data["tasks"] = point.mix     # under the summed objective: the loss weights' ratios
    if point.objective:           # else pretrain.train.objective, else the family's
        data["train"] = {**data.get("train", {}), "objective": point.objective}
    data["mlflow"] = {"enabled": True, "tracking_uri": cfg.mlflow.tracking_uri,
                      "experiment": cfg.mlflow.experiment,
                      "check_timeout_s": cfg.mlflow.check_timeout_s}
    return load_pretrain_config(data=data)


def local_dir(cfg: SweepConfig, trial_dir: str) -> str:
    """A trial's local folder (``run.output_dir``: an embedded MLflow store's place, unused
    with the sweep's tracking URI): the trial's own folder when it is local, else one under
    the sweep's local folder."""
    from vlp.platform.cluster.run_storage import is_uri

    if not is_uri(trial_dir):
        return trial_dir
    return str(cfg.sweep_dir / posixpath.basename(posixpath.dirname(trial_dir.rstrip("/")))
               / posixpath.basename(trial_dir.rstrip("/")))


def model_init(cfg: SweepConfig, point: TrialPoint) -> dict[str, str]:
    """The pretraining config's ``model.init`` / ``model.init_path`` for the point's init
    (``cfg.model.text_init`` resolved: minilm or bert:<path>, see ``resolve_text_init``)."""
    if point.init != "text":
        return {"init": "random"}
    text = cfg.model.text_init
    if not text.startswith("bert:"):
        # not resolved yet (the preflight): minilm where the run will use it; world-text
        # weights are trained for this very family, so a random init of it is their stand-in
        # (the packaged MiniLM would be refused by the init-weights check on a -tiny family)
        from vlp.platform.sweep.space import init_problem

        family = cfg.model.family
        uses_minilm = text == "minilm" or (
            text == "auto" and init_problem("text", family, "minilm") is None)
        return {"init": "minilm" if uses_minilm else "random"}
    return {"init": "bert", "init_path": cfg.model.text_init[len("bert:"):]}


def resolve_text_init(cfg: SweepConfig, points: list[TrialPoint], say=print) -> SweepConfig:
    """``auto`` → minilm where it fits the family, else world-text; ``world-text`` → text-only
    MLM weights trained once on the world's captions (cached beside the sweeps, in their
    storage) → bert:<file or URI>."""
    import hashlib

    from vlp.platform.sweep.space import init_problem

    text = cfg.model.text_init
    if text.startswith("bert:") or text == "minilm" or not any(p.init == "text" for p in points):
        return cfg
    if text == "auto" and init_problem("text", cfg.model.family, "minilm") is None:
        text = "minilm"
    else:
        from vlp.platform.cluster.run_storage import open_location
        from vlp.platform.sweep.text_init import text_init_in_storage

        tag = hashlib.sha1(cfg.world.encode()).hexdigest()[:8]
        folder = f"text-init/{cfg.model.family}-{tag}"
        # beside the sweeps in their storage (trials on other nodes read them there); on the
        # driver's local folder only while they are trained
        storage = open_location(cfg.sweep.storage or cfg.sweep.output_dir)
        text = "bert:" + text_init_in_storage(
            cfg.model.family, world=cfg.world, storage=storage, folder=folder,
            local=str(Path(cfg.sweep.output_dir) / folder), seed=cfg.sweep.seed, say=say)
    return cfg.model_copy(update=dict(model=cfg.model.model_copy(update=dict(text_init=text))))


def text_init_checkpoint(cfg: SweepConfig) -> str:
    """A ``bert:<path>`` text init as a model state-dict file, written once per sweep into
    its storage (finetune workers on any node read it there): the finetune job loads
    checkpoints (and the packaged MiniLM), not BERT folders."""
    import tempfile

    import torch

    from vlp.datasets.storage.world import load_manifest
    from vlp.models import create_model
    from vlp.platform.training.weights_location import local_weights

    storage = cfg.sweep_storage()
    if storage.exists("text-init", "model.pt"):
        return storage.uri("text-init", "model.pt")
    m = load_manifest(cfg.world, check_files=False)
    try:
        # a URI (the sweep's storage): fetched into this node's cache
        init = "bert:" + local_weights(cfg.model.text_init[len("bert:"):])
        model = create_model(cfg.model.family, ["mlm"], init=init,
                             region_feat_dim=m.feature_dim, num_classes=m.num_classes).model
    except Exception as e:      # the loader's message may not name the file
        raise RuntimeError(f"text init {cfg.model.text_init} (model.text_init): "
                           f"{type(e).__name__}: {e}") from e
    with tempfile.TemporaryDirectory(prefix="vlp-text-init-") as tmp:
        torch.save(model.state_dict(), f"{tmp}/model.pt")
        # concurrent trials may both write it: same bytes, each write atomic
        storage.upload(f"{tmp}/model.pt", "text-init", "model.pt")
    return storage.uri("text-init", "model.pt")


def finetune_kwargs(cfg: SweepConfig, point: TrialPoint, checkpoint: str | None,
                    benchmark: str, *, trial: str, trial_dir: str,
                    parent_run_id: str | None, seed: int | None = None) -> dict[str, Any]:
    """Arguments of ``finetune_and_evaluate`` for one benchmark of one trial (``seed``: the
    replicate's, default ``sweep.seed``). Without a checkpoint the model starts from the
    point's init (random: Table 3 L1; text: L2)."""
    overrides = list(cfg.finetune.overrides)
    if checkpoint is None and point.init == "text":
        if not cfg.model.text_init.startswith("bert:"):        # minilm (or the preflight)
            overrides.append("model.init=minilm")
        else:
            checkpoint = text_init_checkpoint(cfg)
    overrides.append(f"scaling.cpus_per_worker={cfg.finetune.cpus_per_worker}")
    if cfg.finetune.use_gpu:
        overrides.append("scaling.use_gpu=true")
    return dict(checkpoint=checkpoint, benchmarks=[benchmark], world=cfg.world,
                family=cfg.model.family, run_name=f"{trial}-ft",
                output_dir=local_dir(cfg, trial_dir), storage=trial_dir,
                parent_run_id=parent_run_id, overrides=overrides,
                seed=cfg.sweep.seed if seed is None else seed,
                num_workers=cfg.finetune.num_workers, tracking_uri=cfg.mlflow.tracking_uri,
                mlflow=True)


def finetune_config(cfg: SweepConfig, point: TrialPoint, benchmark: str, trial_dir: str):
    """The ``FinetuneConfig`` a trial's finetune of ``benchmark`` loads (for the preflight:
    the same overrides, a random init, no MLflow)."""
    from vlp.platform.finetune import load_finetune_config

    kw = finetune_kwargs(cfg, point, None, benchmark, trial="check", trial_dir=trial_dir,
                         parent_run_id=None)
    data = {"run": {"name": kw["run_name"], "output_dir": trial_dir, "seed": kw["seed"]},
            "model": {"family": kw["family"], "init": "random", "checkpoint": ""},
            "world": kw["world"], "benchmarks": kw["benchmarks"],
            "scaling": {"num_workers": kw["num_workers"]}, "mlflow": {"enabled": False}}
    return load_finetune_config(data=data, overrides=kw["overrides"])


def configs_of(cfg: SweepConfig, points: list[tuple[str, TrialPoint]]
               ) -> Iterator[tuple[str, TrialPoint, ExperimentConfig | None]]:
    """(trial name, point, its pretraining config or None) for each named point."""
    for name, point in points:
        trial_dir = str(Path(cfg.sweep.output_dir) / cfg.sweep.name / "trials" / name)
        yield name, point, (pretrain_config(cfg, point, trial=name, trial_dir=trial_dir)
                            if point.pretrains else None)


def downstream_protocol(cfg: SweepConfig) -> str:
    """``benchmark:protocol …`` the sweep's finetunes use (the same for every trial: the
    family's paper's unless the finetune overrides say otherwise); the trial runs' tag, which
    the leaderboard's header reads."""
    from vlp.benchmarks.protocols import protocol_label

    trial_dir = str(cfg.sweep_dir / "trials" / "check")
    return protocol_label({b: finetune_config(cfg, TrialPoint(), b, trial_dir).protocol_of(b)[0]
                           for b in cfg.finetune.benchmarks})
