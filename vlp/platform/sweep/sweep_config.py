"""The sweep config: one YAML file describes a search (or a replay) over pretraining configs.

    cfg = load_sweep_config("jobs/configs/sweep-demo.yaml", ["sweep.num_samples=6"])

Sections: ``sweep`` (name, where, how many trials, search or replay, scheduler), ``world``
(the data: a vlp world folder), ``model.family``, ``pretrain`` (what every trial's pretraining
shares: steps, optimizer, batch, scaling — sections of a pretraining config), ``finetune``
(benchmarks in the order they run, their settings), ``space`` (the search space) and
``mlflow``. Structure and values are checked on load; what needs the model registry and the
world (tasks against the family, sources, shards) is checked by ``preflight.check_sweep``
before any trial starts.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Literal

from pydantic import Field

from vlp.benchmarks import meta_sum
from vlp.contract.config_loader import ConfigModel, load_config
from vlp.platform.pretrain.experiment_config import name_and_folder_problems
from vlp.platform.sweep.space import SearchSpace

if TYPE_CHECKING:
    from vlp.platform.cluster.run_storage import RunStorage

# keys of ``pretrain`` that the sweep decides per trial (a user value would be ignored)
OWNED_BY_SWEEP = {
    "run": ("name", "output_dir", "storage", "seed"),
    "model": ("family", "init", "init_path"),
    "data": ("sources", "masking"),
    "tasks": None, "stages": None, "mlflow": None,
}
# the benchmarks that score Table 3's Meta-Sum parts, retrieval first as before (a trial's
# stages run in this order, and ASHA compares trials stage by stage)
DEFAULT_BENCHMARKS = ["retrieval", *(b for b in meta_sum.BENCHMARKS if b != "retrieval")]
TEXT_INITS = ("auto", "minilm", "world-text")


class SweepSection(ConfigModel):
    name: str = "sweep"              # the sweep's folder and MLflow parent run
    output_dir: str = "runs/sweeps"  # local root: <output_dir>/<name>/ (Ray's log), MLflow store
    # where the sweep's folder lives (Tune's state, trials' runs and checkpoints): a folder or a
    # URI (s3://bucket/vlp); "" = $VLP_STORAGE, else output_dir. Trials on other nodes write
    # there, and a restore reads it: a multi-node cluster needs a URI or a shared mount
    storage: str = ""
    seed: int = Field(0, ge=0)     # Optuna's TPE seed and the first replicate's training seed
    # replicates: every point trains and finetunes `seeds` times, with training seeds
    # seed, seed+1, ... (the world stays fixed); Optuna and ASHA see the replicates' mean
    seeds: int = Field(1, ge=1)
    # replicates of named `include` points (others: `seeds`): e.g. {none: 3} with seeds 1
    # gives the leaderboard a noise estimate (no pretraining's spread) for single-seed lines
    include_seeds: dict[str, int] = Field(default_factory=dict)
    replay: str = ""                 # "" = Optuna search over `space`; else a replay (table3)
    # a replay's lines to run (e.g. [L01, L02, L06, L10]: a seeds-K replay of the lines that
    # matter most when all of them do not fit); [] = every line
    lines: list[str] = Field(default_factory=list)
    num_samples: int = Field(8, gt=0)       # search: trials, the `include` points among them
    include: list[str] = Field(default_factory=lambda: ["none", "paper-best"])
    max_concurrent: int = Field(0, ge=0)    # trials at once; 0 = from the cluster's CPUs
    scheduler: Literal["asha", "fifo"] = "asha"   # replays always run every line to the end
    grace_period: int = Field(1, ge=1)      # ASHA: finetune stages before the first cut
    reduction_factor: int = Field(2, ge=2)  # ASHA: keep the top 1/rf at each rung
    trial_retries: int = Field(0, ge=0)     # Tune retries of a failed trial (then: failed)
    # TPE samples this many points at random before it models the results (Optuna's own
    # default, 10, is most of a laptop sweep); the `include` points count among them
    tpe_startup: int = Field(4, ge=1)

    def validate(self):
        yield from name_and_folder_problems(self.name, self.output_dir)


class SweepModel(ConfigModel):
    family: str = "uniter-tiny"
    # the "text" init of the space (Table 3's BERT init): minilm = the packaged MiniLM-L6-H384
    # (families sized like it: *-minilm); bert:<path> = BERT weights of the family's size;
    # world-text = text-only MLM weights trained on the world's captions (sweep/text_init.py,
    # for sizes no published BERT has); auto = minilm where it fits, else world-text
    text_init: str = "auto"

    def validate(self):
        if self.text_init not in TEXT_INITS and not (self.text_init.startswith("bert:")
                                                     and len(self.text_init) > len("bert:")):
            yield "text_init", (f"expected {', '.join(TEXT_INITS)} or bert:<path>, got "
                                f"{self.text_init!r}")


class SweepFinetune(ConfigModel):
    # run in this order, one stage each: ASHA compares trials on the sum so far
    benchmarks: list[str] = Field(default_factory=lambda: list(DEFAULT_BENCHMARKS))
    overrides: list[str] = Field(default_factory=list)   # finetune config key=value
    num_workers: int = Field(1, ge=1)
    cpus_per_worker: float = Field(1.0, gt=0)
    use_gpu: bool = False            # one GPU per finetune worker


class SweepMlflow(ConfigModel):
    # "" = $MLFLOW_TRACKING_URI (cluster.yaml sets it to the head's server), else
    # sqlite:///<sweep.output_dir>/mlflow.db
    tracking_uri: str = ""
    experiment: str = "vlp-sweep"
    check_timeout_s: float = Field(3.0, gt=0)


class SweepConfig(ConfigModel):
    sweep: SweepSection = Field(default_factory=SweepSection)
    world: str = ""
    model: SweepModel = Field(default_factory=SweepModel)
    pretrain: dict[str, Any] = Field(default_factory=dict)
    finetune: SweepFinetune = Field(default_factory=SweepFinetune)
    space: SearchSpace = Field(default_factory=SearchSpace)
    mlflow: SweepMlflow = Field(default_factory=SweepMlflow)

    def validate(self):
        if not self.world:
            yield "world", "expected a world folder (manifest.json), e.g. runs/demo/world"
        for section, keys in OWNED_BY_SWEEP.items():
            if section not in self.pretrain:
                continue
            value = self.pretrain[section]
            if keys is None:
                yield f"pretrain.{section}", _owned_message(section)
            elif isinstance(value, dict):
                for k in keys:
                    if k in value:
                        yield f"pretrain.{section}.{k}", _owned_message(f"{section}.{k}")
        if not self.finetune.benchmarks:
            yield "finetune.benchmarks", "expected at least one benchmark"
        if len(set(self.finetune.benchmarks)) != len(self.finetune.benchmarks):
            yield "finetune.benchmarks", f"a benchmark is listed twice: {self.finetune.benchmarks}"
        if self.sweep.lines and not self.sweep.replay:
            yield "sweep.lines", "names a replay's lines, but sweep.replay is not set"
        if self.sweep.replay:
            return
        dup = sorted({n for n in self.sweep.include if self.sweep.include.count(n) > 1})
        if dup:
            yield "sweep.include", (f"lists {', '.join(dup)} more than once: a point is one "
                                    f"line (for replicates set sweep.seeds, or "
                                    f"sweep.include_seeds: {{{dup[0]}: K}})")
        for name, k in self.sweep.include_seeds.items():
            if name not in self.sweep.include:
                yield f"sweep.include_seeds.{name}", (f"{name!r} is not an include point "
                                                      f"(sweep.include: {self.sweep.include})")
            elif not isinstance(k, int) or k < 1:
                yield f"sweep.include_seeds.{name}", f"expected a number of seeds ≥ 1, got {k!r}"
        if len(self.sweep.include) > self.sweep.num_samples:
            yield "sweep.include", (f"{len(self.sweep.include)} points to evaluate first but "
                                    f"sweep.num_samples is {self.sweep.num_samples}")

    # ---- derived ------------------------------------------------------------------------

    def resolved(self) -> "SweepConfig":
        """Absolute paths (Ray workers and job drivers run in other folders) and the
        tracking URI filled in."""
        from vlp.platform.tracking.mlflow_run import embedded_tracking_uri

        from vlp.platform.cluster.run_storage import is_uri, resolve

        root = str(Path(self.sweep.output_dir).expanduser().resolve())
        storage = resolve(self.sweep.storage, root).root
        uri = (self.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
               or embedded_tracking_uri(root))
        return self.model_copy(update=dict(
            world=self.world if is_uri(self.world)       # a world in shared storage
            else str(Path(self.world).expanduser().resolve()),
            sweep=self.sweep.model_copy(update=dict(output_dir=root, storage=storage)),
            mlflow=self.mlflow.model_copy(update=dict(tracking_uri=uri))))

    @property
    def sweep_dir(self) -> Path:
        """The sweep's local folder (Ray's log, text-init weights made on the driver)."""
        return Path(self.sweep.output_dir) / self.sweep.name

    @property
    def sweep_uri(self) -> str:
        """The sweep's folder in its storage (resolved config): Tune's state, the trials'
        runs; the same as ``sweep_dir`` unless ``sweep.storage`` / $VLP_STORAGE is set."""
        return posixpath.join(self.sweep.storage or str(self.sweep_dir.parent), self.sweep.name)

    def sweep_storage(self) -> "RunStorage":
        from vlp.platform.cluster.run_storage import open_location

        return open_location(self.sweep_uri)

    @property
    def mode(self) -> str:
        return f"replay:{self.sweep.replay}" if self.sweep.replay else "search"


def _owned_message(key: str) -> str:
    where = {"run.name": "sweep.name", "run.output_dir": "sweep.output_dir",
             "run.storage": "sweep.storage",
             "run.seed": "sweep.seed", "model.family": "model.family",
             "model.init": "space.init", "data.sources": "space.data (the world's domains)",
             "data.masking": "space.masking", "tasks": "space.tasks / space.ratios",
             "mlflow": "the sweep's mlflow section"}.get(key)
    if key == "stages":
        return "multi-stage pretraining is not searched over: a sweep trial has one stage"
    return f"set per trial by the sweep{f' (from {where})' if where else ''}; remove it here"


def load_sweep_config(path: str | Path | None = None, overrides: Iterable[str] = (), *,
                      data: dict | None = None) -> SweepConfig:
    """Load, override and check the structure; ``ConfigError`` names every bad key."""
    return load_config(SweepConfig, path, overrides, data=data)
