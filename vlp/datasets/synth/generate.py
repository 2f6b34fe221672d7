"""``generate_world``: write a complete synthetic world (image shards, task tables, ground
truth sidecars, manifest) for one scale and seed.

Everything is written into a hidden temporary folder beside the target and renamed into
place at the end, so an interrupted run never leaves a folder that looks like a world.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from vlp.datasets.storage.task_tables import write_task_table
from vlp.contract.atomic_write import write_json_atomic
from vlp.datasets.synth.captions import cc_caption, coco_captions, sbu_caption, vg_phrases
from vlp.datasets.synth.detector import CLASS_NAMES, NUM_CLASSES, DetectorConfig, SimulatedDetector
from vlp.datasets.synth.gt_features import GT_FOLDER, GT_SIDECAR, write_gt_features
from vlp.datasets.synth.scales import ScaleConfig, get_scale
from vlp.datasets.synth.scene import IN_DOMAIN, OUT_OF_DOMAIN
from vlp.datasets.synth.source_writer import SourceWriter
from vlp.datasets.synth.tasks import TASKS, build_task_tables
from vlp.datasets.synth.vocabulary import (CLASSES, COLOUR_NAMES, HYPERNYMS, MATERIALS, RELATIONS,
                                           SIZE_NAMES)
from vlp.datasets.storage.world import MANIFEST_NAME, SourceInfo, WorldManifest

GENERATOR = "vlp.datasets.synth/1"
# source → (domain, scene style, captioner)
PRETRAIN_SOURCES = {
    "coco": ("in", IN_DOMAIN, lambda s, r: coco_captions(s, r, 5)),
    "vg": ("in", IN_DOMAIN, vg_phrases),
    "cc": ("out", OUT_OF_DOMAIN, lambda s, r: [cc_caption(s, r)]),
    "sbu": ("out", OUT_OF_DOMAIN, lambda s, r: [sbu_caption(s, r)]),
}


def generate_world(out_dir: str | os.PathLike, scale: str = "tiny", seed: int = 0, *,
                   overwrite: bool = False, progress: bool = False) -> Path:
    """Generate the world for ``scale`` and ``seed`` into ``out_dir`` and return its path.

    ``out_dir`` must not exist, be empty, or (with ``overwrite``) hold a previous world; any
    other non-empty folder is refused rather than deleted.
    """
    out = Path(out_dir).absolute()
    _check_target(out, overwrite)
    cfg = get_scale(scale)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a world is shared data
    try:
        manifest = _generate_into(tmp, cfg, int(seed), progress)
        write_json_atomic(tmp / MANIFEST_NAME, manifest.to_json())
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _check_target(out: Path, overwrite: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder")
    if any(out.iterdir()):
        if not (out / MANIFEST_NAME).is_file():
            raise FileExistsError(f"{out} exists, is not empty and is not a vlp world: "
                                  f"refusing to replace it")
        if not overwrite:
            raise FileExistsError(f"{out} already holds a world; pass --overwrite to replace it")


def _swap_into_place(tmp: Path, out: Path) -> None:
    if out.exists():
        trash = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, trash)
        os.replace(tmp, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, out)


def _generate_into(root: Path, cfg: ScaleConfig, seed: int, progress: bool) -> WorldManifest:
    from tqdm import tqdm

    detector = SimulatedDetector(DetectorConfig(cfg.feature_dim))
    bar = tqdm(total=cfg.total_images, unit="img", desc=f"synth {cfg.name}",
               disable=not progress, dynamic_ncols=True)
    meta = {"world_seed": seed, "scale": cfg.name, "generator": GENERATOR}
    writer = SourceWriter(root, cfg, seed, detector, meta, on_image=lambda: bar.update(1))
    sources: dict[str, SourceInfo] = {}
    for name, (domain, style, captioner) in PRETRAIN_SOURCES.items():
        sources[name], _ = writer.write(name, domain, style, captioner,
                                        {"train": cfg.pretrain_images[name]})
    sources["downstream"], down = writer.write("downstream", "downstream", IN_DOMAIN, None,
                                               cfg.downstream_images)
    bar.close()
    # RefCOCO+'s ground-truth setting: features of the annotated boxes (gt_features.py)
    write_gt_features(root, down, seed, detector, cfg.images_per_shard, meta)

    tasks: dict[str, dict[str, str]] = {t: {} for t in TASKS}
    task_rows: dict[str, dict[str, int]] = {t: {} for t in TASKS}
    for split, scenes in down.items():
        for task, cols in build_task_tables(scenes, split, cfg, seed).items():
            rel = f"tasks/{task}/{split}.parquet"
            write_task_table(root / rel, task, cols, extra_meta=meta)
            tasks[task][split] = rel
            task_rows[task][split] = len(next(iter(cols.values())))

    write_json_atomic(root / "meta" / "unrelated_pairs.json", {
        "description": "out-of-domain image-caption pairs whose caption does not describe "
                       "the image (web_text: boilerplate; other_image: another picture's "
                       "caption); caption_index indexes the image's captions list",
        "pairs": writer.unrelated})
    return WorldManifest(
        name=f"vlp-synth-{cfg.name}-seed{seed}", generator=GENERATOR,
        feature_dim=cfg.feature_dim, num_classes=NUM_CLASSES, class_names=list(CLASS_NAMES),
        feature_extractor=detector.cfg.name, sources=sources, tasks=tasks, seed=seed,
        scale=cfg.name, image_size=cfg.image_size,
        vocabulary={"classes": list(CLASSES), "colours": list(COLOUR_NAMES),
                    "sizes": list(SIZE_NAMES), "materials": list(MATERIALS),
                    "relations": sorted(RELATIONS), "hypernyms": list(HYPERNYMS)},
        task_rows=task_rows,
        sidecars={"scenes": "scenes", "unrelated_pairs": "meta/unrelated_pairs.json",
                  GT_SIDECAR: GT_FOLDER},
        stats={**writer.tally.summary(), "unrelated_pairs": len(writer.unrelated)},
        root=root)
