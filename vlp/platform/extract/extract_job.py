"""`vlp data extract` as a Ray Data batch-inference job, laid out as Ray's guide lays one out:

    ids + paths ─► read, decode, orient, resize (CPU tasks) ─► extractor (actor pool, one
    per GPU, or N CPU actors) ─► validated shard writer (CPU tasks, writing to the output URI)
    ─► driver: the manifest, shard by shard (it sees names and counts, never features)

Everything that can be checked is checked before Ray starts (inputs, names, settings, the
weights against the model, the output folder's existing features): ``plan`` does it and
``--check`` stops after it, having written nothing.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vlp.contract.uri_files import is_uri
from vlp.datasets.importers.data_folder import check_compatible, safe_name
from vlp.datasets.storage.shard_format import SPLITS
from vlp.models.vision.extractors.base import ExtractSettings
from vlp.models.vision.extractors.registry import EXTRACTORS, build_extractor, extractor_entry
from vlp.platform.extract.given_boxes import GivenBoxes, check_listing, read_given_boxes
from vlp.platform.extract.image_sources import ImageRef, image_refs, images_in, images_listed
from vlp.platform.extract.shard_sink import (ExistingShards, ManifestCommit, extract_record,
                                             load_world)
from vlp.platform.extract.shard_stage import images_location


MAX_BLOCKS = 2000


@dataclass
class ExtractOptions:
    images: str | None
    image_list: str | None
    model: str
    weights: str            # a path, a URI, or "random"
    source: str
    split: str
    out: str                # a local or mounted folder, or a URI (s3://bucket/world)
    settings: ExtractSettings = field(default_factory=ExtractSettings)
    batch_size: int = 4
    gpus: int = 0
    workers: int = 1
    images_per_shard: int = 1000
    boxes: str | None = None    # given boxes: mattnet:<dataset> or a Parquet (given_boxes.py)

    @property
    def weights_file(self) -> str | None:
        return None if self.weights == "random" else self.weights


@dataclass
class ExtractPlan:
    options: ExtractOptions
    todo: list[ImageRef]
    skipped: int
    metadata: dict[str, str]
    feature_dim: int
    num_classes: int
    existing: ExistingShards
    given: GivenBoxes | None = None

    def describe(self) -> str:
        o = self.options
        pool = (f"{o.gpus} GPU actor(s), 1 GPU each" if o.gpus
                else f"{o.workers} CPU actor(s)")
        return (f"extract: {len(self.todo)} images to extract ({self.skipped} already in "
                f"{images_location(o.out, o.source)}) with {o.model} "
                f"[{self.metadata['extract_settings']}; weights "
                f"{self.metadata['weights_sha256']}]"
                f"{f' on {self.given.describe()}' if self.given else ''} → "
                f"{self.feature_dim}-d features"
                f"{f', {self.num_classes} classes' if self.num_classes else ''}; "
                f"batch {o.batch_size} on {pool}; shards "
                f"{images_location(o.out, o.source)}/{o.split}-<token>-00000.parquet "
                f"(≤ {o.images_per_shard} images each)")


def _check_options(o: ExtractOptions) -> None:
    if (o.images is None) == (o.image_list is None):
        raise ValueError("give one of --images DIR|URI and --image-list FILE")
    extractor_entry(o.model)
    safe_name("--source", o.source)
    if o.split not in SPLITS:
        raise ValueError(f"--split {o.split!r}: expected one of {', '.join(SPLITS)}")
    problems = o.settings.problems()
    if problems:
        raise ValueError("; ".join(problems))
    for name in ("batch_size", "images_per_shard"):
        if getattr(o, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(o, name)}: expected ≥ 1")
    if o.gpus < 0 or o.workers < 1:
        raise ValueError(f"--gpus {o.gpus} / --workers {o.workers}: expected gpus ≥ 0, "
                         f"workers ≥ 1")
    if o.weights_file and not is_uri(o.weights_file) and not Path(o.weights_file).is_file():
        raise ValueError(f"--weights {o.weights}: no such file (a path, a URI, or random)")
    if o.boxes is not None and not extractor_entry(o.model).takes_boxes:
        detectors = ", ".join(e.name for e in EXTRACTORS.values() if e.takes_boxes)
        raise ValueError(f"--boxes {o.boxes}: {o.model} cannot take given boxes (a grid "
                         f"model's regions are its G×G cells, pixels writes the image: there "
                         f"is no box to pool); given boxes need a detector's RoI head: "
                         f"{detectors}")


def _probe(o: ExtractOptions) -> tuple[dict[str, str], int, int]:
    """Build the extractor as the actors will (weights checked key by key) and run it on one
    small image: its metadata, feature width and class count, known before any actor. The
    image goes in as it is (scale 1; ``extract`` takes prepared images of any size), not
    resized per the settings: the widths do not depend on the size, and BUTD's 600/1000
    made the driver run butd-r101-c4 on a 600×800 image on its CPU (24 s here)."""
    import numpy as np
    import torch

    from vlp.platform.training.weights_location import local_weights

    local = local_weights(o.weights_file) if o.weights_file else None
    extractor = build_extractor(o.model, local, o.settings).eval()
    rgb = np.full((64, 48, 3), 128, np.uint8)
    out = extractor.extract([torch.from_numpy(rgb)], [1.0], [(64, 48)])[0]
    soft = out.get("soft_labels")
    return extractor.metadata(), int(out["features"].shape[1]), (
        0 if soft is None else int(soft.shape[1]))


def plan(o: ExtractOptions) -> ExtractPlan:
    """Every check that needs no cluster; raises ``ValueError`` with one line."""
    _check_options(o)
    where = o.images or o.image_list
    refs = image_refs(images_in(o.images) if o.images else images_listed(o.image_list), where)
    given = read_given_boxes(o.boxes, o.out) if o.boxes is not None else None
    meta, dim, classes = _probe(o)
    if given is not None:
        meta = {**meta, "given_boxes": given.identity}
    try:
        existing = ExistingShards(images_location(o.out, o.source))
        world = load_world(o.out)
    except OSError as e:
        raise ValueError(f"--out {o.out}: cannot read it ({str(e).splitlines()[0]})") from None
    problem = existing.problem(o.model, meta)
    if problem:
        raise ValueError(problem)
    check_compatible(world, o.source, feature_dim=dim,
                     num_classes=classes, feature_extractor=o.model)
    todo = [r for r in refs if r.image_id not in existing.ids]
    if given is not None:
        check_listing(given, todo)
    return ExtractPlan(o, todo, len(refs) - len(todo), meta, dim, classes, existing, given)


def build_dataset(p: ExtractPlan, writer_meta: dict[str, str] | None = None):
    """The lazy Ray Dataset: rows of ``RESULT_SCHEMA`` (one per image, failures included),
    or, with ``writer_meta``, the shards written from the workers: rows of
    ``COMMIT_SCHEMA`` (one per shard and one per failed image)."""
    import ray
    from ray.data import ActorPoolStrategy

    from vlp.platform.extract.decode_stage import PrepareImages
    from vlp.platform.extract.model_stage import RunExtractor

    o = p.options
    items = [{"image_id": r.image_id, "location": r.location} for r in p.todo]
    if p.given is not None:     # each image's boxes travel in its own row
        items = [{**item, "given_boxes": p.given.encoded(item["image_id"])} for item in items]
    # enough blocks that every decode task and actor has work from the start, few enough
    # that a million-image listing does not become a million scheduler entries
    blocks = max(1, min(MAX_BLOCKS, (len(items) + o.batch_size - 1) // o.batch_size))
    ds = ray.data.from_items(items, override_num_blocks=blocks)
    ds = ds.map_batches(PrepareImages(o.model, o.settings), batch_size=o.batch_size,
                        batch_format="numpy", num_cpus=1)
    actors = o.gpus or o.workers
    resources = {"num_gpus": 1} if o.gpus else {"num_cpus": 1}
    ds = ds.map_batches(RunExtractor, fn_constructor_args=(o.model, o.weights_file,
                                                            o.settings, bool(o.gpus)),
                        compute=ActorPoolStrategy(size=actors), batch_size=o.batch_size,
                        batch_format="numpy", **resources)
    if writer_meta is None:
        return ds
    from vlp.platform.extract.shard_stage import WriteShards
    return ds.map_batches(WriteShards(o.out, o.source, o.split, o.model, writer_meta),
                          batch_size=o.images_per_shard, batch_format="pyarrow", num_cpus=1)


class JobFailed(RuntimeError):
    """The job stopped for a reason that is one line (not a per-image failure)."""


def _autoscales() -> bool:
    """Whether this cluster's autoscaler may add nodes: ``ray up`` leaves its bootstrap
    config in the head's home folder, where a submitted job's driver runs."""
    return (Path.home() / "ray_bootstrap_config.yaml").is_file()


def check_cluster(o: ExtractOptions, gpus_now: float | None = None,
                  autoscales: bool | None = None) -> None:
    """Once Ray is attached, before any actor starts: on a job whose workers span nodes, an
    ``--out`` only this node can reach is refused (pretraining's storage rule,
    ``run_storage.check_shared``); ``--gpus N`` above the cluster's GPUs is refused (Ray
    would wait forever for the actors), unless an autoscaler may add GPU nodes.
    ``ValueError`` with one line."""
    from vlp.platform.cluster import run_storage
    from vlp.platform.cluster.job_nodes import job_span

    span = job_span(o.gpus or o.workers, {"GPU": 1.0} if o.gpus else {"CPU": 1.0})
    try:
        run_storage.check_shared(run_storage.open_location(o.out), nodes=span.nodes,
                                 why=span.why, what="--out",
                                 fix="the workers write the shards there: give --out "
                                     "s3://<bucket>/<world>")
    except run_storage.StorageError as e:
        raise ValueError(str(e)) from None
    if not o.gpus:
        return
    if gpus_now is None:
        import ray
        gpus_now = float(ray.cluster_resources().get("GPU", 0.0))
    if o.gpus <= gpus_now:
        return
    if autoscales if autoscales is not None else _autoscales():
        print(f"extract: --gpus {o.gpus}, the cluster has {gpus_now:g} GPU(s) now: the "
              f"autoscaler must add the rest before the actors start", file=sys.stderr)
        return
    raise ValueError(f"--gpus {o.gpus}: the Ray cluster has {gpus_now:g} GPU(s) (and no "
                     f"autoscaler to add more): the actors would wait forever; ask for at most "
                     f"{gpus_now:g}")


@dataclass
class ExtractReport:
    written: int = 0
    skipped: int = 0
    failed: list[str] = field(default_factory=list)
    shards: int = 0
    seconds: float = 0.0
    # the steady rate: the model stage's images after each actor's first batch, and the
    # seconds from the first such batch's start to the last one's end (the decode stage's
    # and the writes' start and drain left out: results reach this process in bursts, and
    # a window over their arrivals read 3-7x the model's own rate on a CPU)
    steady_images: int = 0
    steady_seconds: float = 0.0
    nodes: set[str] = field(default_factory=set)   # Ray nodes whose workers wrote shards

    @property
    def images_per_s(self) -> float:
        return self.written / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_images_per_s(self) -> float:
        return self.steady_images / self.steady_seconds if self.steady_seconds > 0 else 0.0


class _Progress:
    def __init__(self, total: int, every_s: float = 10.0):
        self.total, self.every_s = total, every_s
        self.start = self.last = time.perf_counter()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.last < self.every_s and done < self.total:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        print(f"extract: {done}/{self.total} images, {rate:.2f} images/s, ETA "
              f"{eta / 60:.1f} min", file=sys.stderr, flush=True)


def run(p: ExtractPlan, progress_every_s: float = 10.0) -> ExtractReport:
    """Run the job (Ray must be initialised): the workers write the shards, this process
    lists each in the manifest as its row arrives."""
    o = p.options
    report = ExtractReport(skipped=p.skipped)
    start = time.perf_counter()
    commit = ManifestCommit(o.out, o.source, o.model, p.existing)
    progress = _Progress(len(p.todo), progress_every_s)
    if p.todo:
        done, warm = 0, []
        for batch in _batches(build_dataset(p, commit.writer_meta(p.metadata))):
            for row in batch.to_pylist():
                if row["shard"]:
                    commit.add(row["shard"], row["rows"], row["feature_dim"],
                               row["num_classes"])
                    report.written += row["rows"]
                    done += row["rows"]
                    report.nodes.add(row["node"])
                    if row["warm_images"]:
                        warm.append((row["warm_images"], row["warm_start"], row["warm_end"]))
                else:
                    report.failed.append(f"{row['location']}: {row['error']}")
                    done += 1
            progress.update(done)
        if warm:
            report.steady_images = sum(n for n, _, _ in warm)
            report.steady_seconds = max(e for _, _, e in warm) - min(s for _, s, _ in warm)
    report.seconds = time.perf_counter() - start
    commit.finish(extract_record([o.images or o.image_list], {
        "images": report.written, "skipped": report.skipped, "failed": len(report.failed)},
        {"model": o.model, "weights": o.weights, "source": o.source, "split": o.split,
         "boxes": o.boxes, **p.metadata}, [f"images/{o.source}"]))
    report.shards = commit.shards_written
    return report


def _batches(ds):
    """The dataset's result batches; a deterministic actor failure (no CUDA) ends the job
    with its own line, not Ray's trace."""
    from vlp.platform.extract.model_stage import NO_CUDA

    it = iter(ds.iter_batches(batch_size=None, batch_format="pyarrow"))
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except Exception as e:
            text = str(e)
            if NO_CUDA in text:
                start = text.index(NO_CUDA)
                raise JobFailed(text[start:].splitlines()[0]) from None
            raise
        yield batch


def summary(p: ExtractPlan, r: ExtractReport) -> str:
    o = p.options
    return (f"extract: {r.written} images written in {r.shards} shard(s) to "
            f"{images_location(o.out, o.source)} ({r.skipped} skipped as already extracted, "
            f"{len(r.failed)} failed) in {r.seconds:.1f} s, {r.images_per_s:.2f} images/s, "
            f"{o.model} on {o.gpus or o.workers} {'GPU' if o.gpus else 'CPU'} actor(s)")
