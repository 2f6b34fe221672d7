"""A *world*: a folder of image shards and task tables described by ``manifest.json``.

The synthetic generator writes one (``vlp data synth``); importers of real data can write the
same manifest. Everything downstream (the pipeline, finetuning, the audit) finds its files
through :func:`load_manifest` instead of globbing, so a half-written or foreign folder fails
early with a message that says what is wrong.

Layout::

    manifest.json
    images/<source>/<split>-NNNNN.parquet           image shards
    tasks/<task>/<split>.parquet                     downstream task tables
    scenes/<source>.jsonl                            (synthetic) ground-truth objects per image
    meta/unrelated_pairs.json                        (synthetic) alt-text pairs that are noise
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST_NAME = "manifest.json"
WORLD_FORMAT = "vlp-world/1"
DOMAINS = ("in", "out", "downstream")


class WorldError(ValueError):
    """The folder is not a (complete) vlp world; the message names the folder and the problem."""


@dataclass
class SourceInfo:
    folder: str                       # relative to the world root
    domain: str                       # in | out | downstream
    images: int
    pairs: int                        # image–text pairs (captions) for pretraining
    files: dict[str, list[str]]       # split → shard paths relative to the root
    splits: dict[str, int] = field(default_factory=dict)   # split → images


@dataclass
class WorldManifest:
    name: str
    generator: str
    feature_dim: int
    num_classes: int                  # C, the soft-label width, index 0 = background
    class_names: list[str]            # length C
    feature_extractor: str
    sources: dict[str, SourceInfo]
    tasks: dict[str, dict[str, str]]  # task → split → table path relative to the root
    seed: int | None = None
    scale: str | None = None
    image_size: int | None = None
    vocabulary: dict[str, list[str]] = field(default_factory=dict)
    task_rows: dict[str, dict[str, int]] = field(default_factory=dict)
    sidecars: dict[str, str] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)
    format: str = WORLD_FORMAT
    root: Path = field(default=Path("."), compare=False)

    # ------------------------------------------------------------------ paths
    def path(self, relative: str) -> Path:
        return self.root / relative

    def image_files(self, source: str | None = None, split: str | None = None,
                    domain: str | None = None) -> list[Path]:
        """Shards of one source (or all), optionally one split or domain, in a stable order."""
        out = []
        for name, info in self.sources.items():
            if (source and name != source) or (domain and info.domain != domain):
                continue
            for sp, files in info.files.items():
                if split is None or sp == split:
                    out.extend(self.path(f) for f in files)
        return out

    def pretraining_sources(self, domain: str | None = None) -> list[str]:
        return [n for n, i in self.sources.items() if i.domain in ("in", "out")
                and (domain is None or i.domain == domain)]

    def task_file(self, task: str, split: str) -> Path:
        try:
            return self.path(self.tasks[task][split])
        except KeyError:
            raise WorldError(f"{self.root}: world has no {task}/{split} table; it has "
                             f"{ {t: sorted(s) for t, s in self.tasks.items()} }") from None

    # ------------------------------------------------------------------ (de)serialise
    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("root")
        return d

    @classmethod
    def from_json(cls, d: dict, root: Path) -> "WorldManifest":
        d = dict(d)
        d["sources"] = {k: SourceInfo(**v) for k, v in d["sources"].items()}
        return cls(**d, root=root)


def load_manifest(folder: str | os.PathLike, check_files: bool = True) -> WorldManifest:
    """Read and check ``folder/manifest.json``; raise :class:`WorldError` when the folder is not
    a vlp world, the manifest is malformed, or (``check_files``) a file it lists is missing."""
    root = Path(folder)
    if not root.is_dir():
        raise WorldError(f"{root}: no such folder")
    mpath = root / MANIFEST_NAME
    if not mpath.is_file():
        raise WorldError(f"{root}: not a vlp world: no {MANIFEST_NAME} (an unfinished "
                         f"generation leaves none; make a world with `vlp data synth --out "
                         f"{root}`)")
    try:
        raw = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WorldError(f"{mpath}: not valid JSON: {e}") from None
    if not isinstance(raw, dict) or raw.get("format") != WORLD_FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise WorldError(f"{mpath}: format {got!r}, expected {WORLD_FORMAT!r}")
    try:
        m = WorldManifest.from_json(raw, root)
    except TypeError as e:  # missing or unknown keys
        raise WorldError(f"{mpath}: malformed manifest: {e}") from None
    for name, info in m.sources.items():
        if info.domain not in DOMAINS:
            raise WorldError(f"{mpath}: source {name!r} has domain {info.domain!r}, expected "
                             f"one of {DOMAINS}")
    if len(m.class_names) != m.num_classes:
        raise WorldError(f"{mpath}: {len(m.class_names)} class names for num_classes="
                         f"{m.num_classes}")
    if check_files:
        listed = [f for i in m.sources.values() for fs in i.files.values() for f in fs]
        listed += [f for s in m.tasks.values() for f in s.values()]
        for f in listed:
            if not (root / f).is_file():
                raise WorldError(f"{mpath}: lists {f} but the file is missing")
    return m
