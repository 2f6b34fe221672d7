"""``plan_data``: everything the pipeline checks and derives before reading a single row.

From a :class:`DataConfig` and the task mix it checks task names, mix ratios and their fit to
the visual input, that every source folder exists and holds image shards, that the shards
agree on the feature width, that soft labels exist for the tasks that need them and pixels
for the pixel input; all from Parquet footers. Then it counts each source's examples and turns
the sampling weights into per-source rates. The resulting :class:`DataPlan` is small and
picklable: the driver makes it once and hands it to every worker (``source_plan``: the
classes alone, without the task registry and its torch, for Ray Data's map workers).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow.compute as pc
import pyarrow.parquet as pq

from vlp.contract.uri_files import is_uri, open_input, parent
from vlp.datasets.stream.data_config import DataConfig, DataConfigError
from vlp.datasets.stream.source_plan import DataPlan, SourcePlan
from vlp.tasks import TASKS, task_names, visual_problem
from vlp.datasets.storage.shards import list_shards, shard_info
from vlp.datasets.storage.shard_format import ShardError
from vlp.datasets.batching.task_sampler import validate_mix
from vlp.datasets.batching.text_corpus import TextCorpusError, corpus_files
from vlp.datasets.stream.text_tokenizer import resolve_tokenizer_path
from vlp.datasets.storage.world import WorldError, load_manifest

log = logging.getLogger(__name__)

REGION_COLUMNS = ("image_id", "split", "width", "height", "num_boxes", "boxes", "confidences",
                  "features", "captions")
PIXEL_COLUMNS = ("image_id", "split", "pixels", "captions")


def plan_data(config: DataConfig, tasks: Mapping[str, float] | Iterable[str],
              model: Any = None) -> DataPlan:
    """Check config + tasks against the shards' footers and count examples per source.
    With ``model`` (a ``PreprocessSpec`` of ``vlp.models.create_model``) the shards' feature
    width and class count must match the model's. Raises ``DataConfigError`` (naming the key)
    before any row is read."""
    mix = tasks if isinstance(tasks, Mapping) else {t: 1.0 for t in tasks}
    mix = validate_mix(mix, task_names())
    active = [t for t, r in mix.items() if r > 0]
    problems: list[tuple[str, str]] = []
    for t in active:
        problem = visual_problem(t, config.visual, "the data config (visual)")
        if problem:
            problems.append((f"tasks.{t}", problem))
    needs_soft = config.visual == "regions" and any(TASKS[t].needs_soft_labels
                                                    for t in active)
    try:
        tokenizer_path = str(resolve_tokenizer_path(config.tokenizer_path))
    except FileNotFoundError as e:
        problems.append(("tokenizer_path", str(e)))
        tokenizer_path = ""

    schemes = {s.path.split("://")[0] if is_uri(s.path) else "local" for s in config.sources}
    if len(schemes) > 1:   # one reader (Ray Data's read_parquet) takes one filesystem
        problems.append(("sources", f"sources mix storages ({', '.join(sorted(schemes))}): "
                                    f"keep every source's shards in one (all local folders, "
                                    f"or all s3:// URIs)"))
    files_of: dict[str, list[Path]] = {}
    dims: dict[str, tuple[int | None, int | None]] = {}
    for s in config.sources:
        key = f"sources.{s.name}.path"
        try:
            files = list_shards(s.path)
        except ShardError as e:
            problems.append((key, f"{s.path}: {e.problem}"))
            continue
        if not files:
            problems.append((key, f"{s.path}: holds no Parquet shards"))
            continue
        files_of[s.name] = files
        problems += _check_footers(s.name, files, config, needs_soft, active, dims)
    found = {d for d, _ in dims.values() if d is not None}
    if config.visual == "regions" and len(found) > 1:
        problems.append(("sources", "sources disagree on the region feature width: " +
                         ", ".join(f"{n}: {d}" for n, (d, _) in dims.items())))
    classes = {c for _, c in dims.values() if c is not None}
    if needs_soft and len(classes) > 1:
        problems.append(("sources", "sources disagree on the detector class count: " +
                         ", ".join(f"{n}: {c}" for n, (_, c) in dims.items())))
    if model is not None and config.visual == "regions":
        problems += _model_problems(model, found, classes, needs_soft)
    text_tasks = [t for t in active if TASKS[t].text_only]
    if text_tasks and not config.text_corpus:
        problems.append(("text_corpus", f"task {text_tasks[0]} reads text-only batches: give "
                         "a folder of .txt files (a passage a line), data.text_corpus"))
    elif text_tasks:
        try:
            corpus_files(config.text_corpus)
        except TextCorpusError as e:
            problems.append(("text_corpus", str(e)))
    if text_tasks and config.stream == "global":   # the text corpus is a stream per worker
        problems.append(("stream", f"global: task {text_tasks[0]} reads text-only batches from "
                         f"a corpus stream kept per worker, which cannot move to another "
                         f"number of workers yet: expected per_worker with it"))
    object_words: tuple[str, ...] = ()
    if any(TASKS[t].object_words for t in active):
        object_words = config.object_words or world_class_names(config)
        if not object_words:
            problems.append(("object_words", "task mlm-obj masks the words that name objects: "
                             "give them (data.object_words) or read sources inside a vlp "
                             f"world whose manifest.json has class_names (looked above "
                             f"{config.sources[0].path if config.sources else '?'})"))
    if problems:
        raise DataConfigError(problems)

    columns = REGION_COLUMNS + (("soft_labels",) if needs_soft else ()) \
        if config.visual == "regions" else PIXEL_COLUMNS
    if config.visual == "regions" and config.image_feat:
        columns += whole_image_column(config, files_of)
    sources = _rates(config, files_of)
    plan = DataPlan(config, tuple(active), sources,
                    feature_dim=next(iter(found)) if found else 0,
                    num_classes=next(iter(classes)) if classes else None,
                    tokenizer_path=tokenizer_path, read_columns=columns,
                    needs_soft_labels=needs_soft, object_words=object_words)
    log.info("data plan: %s", plan.summary())
    return plan


def whole_image_column(config: DataConfig, files_of: dict[str, list[Path]]) -> tuple[str, ...]:
    """("image_feature",) when every shard has the whole-image RoI column (VL-BERT's text-side
    visual input); otherwise () and a warning naming the sources without it: every batch then
    uses the mean of the image's regions instead. (Rows with a null entry fall back one by
    one, with a warning from the batcher.)"""
    lacking = [name for name, files in files_of.items()
               if any("image_feature" not in pq.read_schema(open_input(f)).names
                      for f in files)]
    if not lacking:
        return ("image_feature",)
    log.warning("VL-BERT's whole-image feature: the shards of source(s) %s have no "
                "image_feature column (written before it existed): the visual input of text "
                "tokens and [END] is the mean of the image's region features for every "
                "source", ", ".join(lacking))
    return ()


def world_class_names(config: DataConfig) -> tuple[str, ...]:
    """The detector class names (background excluded) from the manifest of the world the
    sources sit in (``<world>/images/<source>/``), or () when there is none."""
    for s in config.sources:
        for root in _two_folders_up(s.path):
            try:
                names = load_manifest(root, check_files=False).class_names
            except (WorldError, OSError):
                continue
            return tuple(n for n in names[1:] if n and not n.startswith("__"))
    return ()


def _two_folders_up(path: str) -> list:
    if is_uri(path):        # a world in shared storage: s3://b/world/images/<source>
        up = parent(path)
        return [up, parent(up)]
    return list(Path(path).resolve().parents[:2])


def _model_problems(model: Any, dims: set, classes: set, needs_soft: bool
                    ) -> list[tuple[str, str]]:
    out = []
    want_d = getattr(model, "region_feat_dim", None)
    if want_d and dims and dims != {want_d}:
        out.append(("sources", f"the shards' region features are {sorted(dims)}-d, the model "
                               f"{getattr(model, 'family', '')} expects {want_d}-d "
                               f"(create_model(region_feat_dim=...))"))
    want_c = getattr(model, "num_classes", None)
    if needs_soft and want_c and classes and classes != {want_c}:
        out.append(("sources", f"the shards' detector has {sorted(classes)} classes, the "
                               f"model expects {want_c} (create_model(num_classes=...))"))
    return out


def _check_footers(name: str, files: list[Path], config: DataConfig, needs_soft: bool,
                   tasks: list[str], dims: dict) -> list[tuple[str, str]]:
    key = f"sources.{name}.path"
    problems = []
    for f in files:
        try:
            info = shard_info(f)
        except ShardError as e:
            return [(key, str(e))]
        if info.kind != "images":
            return [(key, f"{f}: kind {info.kind!r}, expected image shards")]
        if config.visual == "regions":
            if not info.feature_dim:
                return [(key, f"{f}: metadata lacks vlp.feature_dim")]
            if needs_soft and not info.num_classes:
                soft_tasks = [t for t in tasks if TASKS[t].needs_soft_labels]
                return [(f"tasks.{soft_tasks[0]}",
                         f"task(s) {soft_tasks} need detector soft labels, but {f} (source "
                         f"{name!r}) has none (no vlp.num_classes)")]
            prev = dims.get(name)
            if prev and prev != (info.feature_dim, info.num_classes):
                return [(key, f"{f}: feature width / classes {info.feature_dim}/"
                              f"{info.num_classes} differ from the folder's other shards "
                              f"{prev[0]}/{prev[1]}")]
            dims[name] = (info.feature_dim, info.num_classes)
        elif not _has_values(f, "pixels"):
            return [(key, f"{f}: no pixels in this shard (visual: pixels needs encoded "
                          f"images)")]
    return problems


def _has_values(path: Path, column: str) -> bool:
    """Whether a column holds any non-null value, from the row-group statistics."""
    md = pq.ParquetFile(open_input(path)).metadata
    names = [md.schema.column(i).name for i in range(md.num_columns)]
    if column not in names:
        return False
    j = names.index(column)
    for g in range(md.num_row_groups):
        col = md.row_group(g).column(j)
        stats = col.statistics
        if stats is None or not stats.has_null_count or stats.null_count < col.num_values:
            return True
    return False


def _count_examples(files: list[Path], config: DataConfig) -> int:
    """Pairs (regions) or captioned images (pixels) of the configured split."""
    n = 0
    for f in files:
        t = pq.read_table(open_input(f), columns=["split", "captions"])
        if config.split is not None:
            t = t.filter(pc.equal(t.column("split"), config.split))
        lens = pc.fill_null(pc.list_value_length(t.column("captions")), 0)
        n += int(pc.sum(lens).as_py() or 0) if config.visual == "regions" \
            else int(pc.sum(pc.greater(lens, 0).cast("int64")).as_py() or 0)
    return n


def _rates(config: DataConfig, files_of: dict[str, list[Path]]) -> tuple[SourcePlan, ...]:
    """Weights are shares of the examples in the stream; an epoch keeps the total count."""
    weighted = [s for s in config.sources if s.weight > 0]
    counts = {s.name: (_count_examples(files_of[s.name], config)
                       if len(weighted) > 1 and s.weight > 0 else 0)
              for s in config.sources}
    problems = [(f"sources.{s.name}.path", f"{s.path}: no captioned images in split "
                                           f"{config.split!r}")
                for s in weighted if len(weighted) > 1 and counts[s.name] == 0]
    if problems:
        raise DataConfigError(problems)
    total_w = sum(s.weight for s in weighted)
    total_n = sum(counts.values())
    out = []
    for s in config.sources:
        if s.weight == 0:
            rate = 0.0
        elif len(weighted) == 1:
            rate = 1.0
        else:
            rate = (s.weight / total_w) * total_n / counts[s.name]
        out.append(SourcePlan(s.name, tuple(str(f) for f in files_of[s.name]), s.weight,
                              counts[s.name], rate))
    return tuple(out)
