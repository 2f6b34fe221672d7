"""What a pretraining job checks and derives on the driver before any compute starts.

From the experiment config: the model family and every stage's task mix against the model
registry (unknown tasks; tasks that do not apply to the family — region tasks need a region
family, MVM needs SOHO), then per stage the pipeline's ``DataConfig`` (the ``data`` section +
what the model decides: visual input, location encoding, vocabulary, text length, image
sizes) and its ``DataPlan`` (source folders exist and hold shards, feature widths agree, soft
labels for the tasks that need them; Parquet footers only). Every problem is raised as one
``ConfigError`` naming its dotted experiment key.

The region feature width D and the detector class count C come from the shards' footers
(what ``plan_data`` reads), so imported data without a world manifest works the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vlp.datasets.stream.data_config import DataConfig, DataConfigError, SourceConfig
from vlp.datasets.stream.data_plan import DataPlan, plan_data
from vlp.datasets.stream.text_tokenizer import load_tokenizer
from vlp.models import get_family, list_families
from vlp.models.families import family_task_problem
from vlp.models.heads import layout_types
from vlp.models.factory import PreprocessSpec, preprocess_spec
from vlp.contract.config_loader import ConfigError
from vlp.platform.pretrain.experiment_config import (DataSection, ExperimentConfig, ModelSection,
                                                     StageSection, check_family, check_task_names)
from vlp.platform.pretrain.init_weights_check import check_init_weights, cnn_init_file
from vlp.tasks import task_names

DEFAULT_NUM_CLASSES = 1601      # only sizes MRC heads, which need soft labels (and so a C)


@dataclass(frozen=True)
class StageData:
    name: str
    dataset: str                # the Ray Dataset's name in the TorchTrainer
    plan: DataPlan


@dataclass(frozen=True)
class PretrainSetup:
    """Everything the workers build from (the model section included); small and picklable."""
    family: str
    tasks: tuple[str, ...]      # every task with a positive ratio in some stage (the heads)
    preprocess: PreprocessSpec
    vocab_size: int
    stages: tuple[StageData, ...]
    model: ModelSection         # init, dropout, SOHO's CNN weights, token types

    @property
    def feature_dim(self) -> int | None:
        return self.preprocess.region_feat_dim

    @property
    def num_classes(self) -> int | None:
        return self.preprocess.num_classes


def prepare(cfg: ExperimentConfig) -> PretrainSetup:
    """All checks and plans for ``cfg`` (relative paths resolve against the cwd): the
    registry checks, the initial weights (read and fitted to the model on the meta device),
    and per stage the data. Raises ``ConfigError`` listing every problem found."""
    check_model_and_tasks(cfg)
    family = get_family(cfg.model.family)
    tasks = tuple(cfg.all_tasks())
    # D and C do not change what the pipeline is asked for: plan first, then size the model
    spec = preprocess_spec(family, tasks, 0, 0)
    problems: list[tuple[str, str]] = []
    if cfg.model.init_path and not _exists(cfg.model.init_path):
        problems.append(("model.init_path", f"{cfg.model.init_path}: no such file (the "
                                            f"weights of model.init {cfg.model.init!r})"))
    problems += cnn_problems(cfg, family)
    problems += text_length_problems(cfg, spec)
    stages = []
    for k, stage in enumerate(cfg.stage_plan()):
        mix_key = f"stages.{k}.tasks" if cfg.stages and cfg.stages[k].tasks else "tasks"
        try:
            plan = plan_data(stage_data_config(cfg, stage, spec), stage.tasks, model=spec)
        except DataConfigError as e:
            problems += [(_experiment_key(key, mix_key), msg) for key, msg in e.problems]
            continue
        stages.append(StageData(stage.name, f"stage{k}", plan))
    if problems:
        raise ConfigError(_unique(problems))
    dims = {(s.plan.feature_dim, s.plan.num_classes) for s in stages}
    if spec.input_kind == "regions" and len({d for d, _ in dims}) > 1:
        raise ConfigError([("stages", "stages read region features of different widths "
                                      f"{sorted(d for d, _ in dims)}: one model cannot take both")])
    classes = {c for _, c in dims if c}
    if len(classes) > 1:
        raise ConfigError([("stages", f"stages' detectors have different class counts "
                                      f"{sorted(classes)}")])
    feat_dim = stages[0].plan.feature_dim or 0
    num_classes = classes.pop() if classes else DEFAULT_NUM_CLASSES
    vocab = load_tokenizer(stages[0].plan.tokenizer_path or None).vocab_size
    setup = PretrainSetup(cfg.model.family, tasks,
                          preprocess_spec(family, tasks, feat_dim, num_classes), vocab,
                          tuple(stages), cfg.model)
    check_init_weights(cfg, setup)    # a checkpoint that does not fit fails here, not in Ray
    return setup


def check_without_inputs(cfg: ExperimentConfig) -> None:
    """What ``prepare`` checks that reads no input file: the family, the task names and their
    fit to it, the text length it embeds, the CNN keys only a SOHO family takes. For a config
    whose inputs are not reachable from here (``input_reach``): raises ``ConfigError``."""
    check_model_and_tasks(cfg)
    family = get_family(cfg.model.family)
    spec = preprocess_spec(family, tuple(cfg.all_tasks()), 0, 0)
    problems = text_length_problems(cfg, spec)
    if family.visual.input_kind != "pixels":
        problems += cnn_problems(cfg, family)       # no file read for a family without a CNN
    if problems:
        raise ConfigError(problems)


def text_length_problems(cfg: ExperimentConfig, spec: PreprocessSpec) -> list[tuple[str, str]]:
    if cfg.data.max_text_len + 2 <= spec.max_text_positions:
        return []
    return [("data.max_text_len", f"is {cfg.data.max_text_len} but {cfg.model.family} embeds "
             f"{spec.max_text_positions} text positions ([CLS] and [SEP] included): expected "
             f"at most {spec.max_text_positions - 2}")]


def cnn_problems(cfg: ExperimentConfig, family) -> list[tuple[str, str]]:
    """``model.cnn_init`` / ``model.cold_start_steps`` need a family with a CNN (SOHO); the
    checkpoint must fit the family's ResNet key by key and shape by shape."""
    soho = family.visual.input_kind == "pixels"
    if not soho:
        return [(f"model.{key}", f"{family.name} has no CNN (only SOHO families have one)")
                for key, on in (("cnn_init", cfg.model.cnn_init),
                                ("cold_start_steps", cfg.model.cold_start_steps),
                                ("dictionary_init", cfg.model.dictionary_init)) if on]
    if not cfg.model.cnn_init:
        return []
    import torch

    from vlp.contract.uri_files import is_uri
    from vlp.models.checkpoints import CheckpointError
    from vlp.models.vision.cnn_weights import cnn_weights_problem
    from vlp.models.vision.resnet import ResNet

    with torch.device("meta"):   # shapes only: nothing allocated
        trunk = ResNet(family.visual.resnet)
    where = cfg.model.cnn_init
    if is_uri(where) and not _exists(where):
        return [("model.cnn_init", f"{where}: no such file (a torchvision ResNet state dict)")]
    try:
        local = cnn_init_file(cfg.model)
    except CheckpointError as e:    # a folder, or the storage failing while it is read
        return [("model.cnn_init", str(e))]
    problem = cnn_weights_problem(trunk, local, shown=where if is_uri(where) else None)
    return [("model.cnn_init", problem.removeprefix("model.cnn_init: "))] if problem else []


def check_model_and_tasks(cfg: ExperimentConfig) -> None:
    """The family exists, every task name is registered, and every task with a positive
    ratio applies to the family (``FamilyConfig.tasks``, from the task registry)."""
    problems = check_family(cfg, list_families()) + check_task_names(cfg, task_names())
    if problems:
        raise ConfigError(problems)
    family = get_family(cfg.model.family)
    mixes = [("tasks", cfg.tasks)] + [(f"stages.{i}.tasks", s.tasks)
                                       for i, s in enumerate(cfg.stages)]
    for key, mix in mixes:
        for name, ratio in mix.items():
            problem = family_task_problem(name, family.name) if ratio > 0 else None
            if problem:
                problems.append((f"{key}.{name}", problem))
    if problems:
        raise ConfigError(problems)


def stage_data_config(cfg: ExperimentConfig, stage: StageSection, spec: PreprocessSpec
                      ) -> DataConfig:
    """The pipeline config of one stage: the ``data`` section, its sources, the run seed
    and what the model decides."""
    sources = tuple(SourceConfig(n, _absolute(cfg.data.sources[n].path),
                                 cfg.data.sources[n].weight) for n in stage.sources)
    options = cfg.data.pipeline_options()
    if options["tokenizer_path"] is None:     # the model's vocabulary
        del options["tokenizer_path"]
    if cfg.model.token_types:   # the data adapter's type ids, from the same pure function
        layout = layout_types(get_family(cfg.model.family), cfg.model.token_types)[1]
        # captions "question [SEP] answer [SEP] rationale": QA→R's segment types
        options["text_segment_types"] = tuple(layout[f"{cfg.model.token_types}_types"]["qa2r"])
    return DataConfig.for_model(spec, sources, seed=cfg.run.seed, **options)


def _experiment_key(pipeline_key: str, mix_key: str) -> str:
    """A ``DataConfigError`` key as the experiment config names it."""
    head, _, rest = pipeline_key.partition(".")
    if head == "tasks":
        return ".".join(p for p in (mix_key, rest) if p)
    field = DataSection.model_fields.get(head)      # the name a user writes (its alias)
    head = (field.alias or head) if field else head
    return "data." + ".".join(p for p in (head, rest) if p)


def _unique(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Stages that share a source report its problem once."""
    return list(dict.fromkeys(problems))


def _absolute(path: str) -> str:
    """A local path made absolute; a URI (``s3://bucket/shards``) as it is."""
    from vlp.platform.cluster.run_storage import is_uri

    return path if is_uri(path) else str(Path(path).expanduser().resolve())


def _exists(path: str) -> bool:
    from vlp.platform.cluster.run_storage import location_exists

    return location_exists(path)
