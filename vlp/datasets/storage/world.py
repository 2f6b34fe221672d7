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

A world may live in shared storage (``s3://bucket/worlds/demo``): it is read through
``vlp.contract.uri_files`` (endpoint and keys from the standard AWS environment), and its
paths are then URI strings where a local world's are ``Path``s.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vlp.contract import uri_files

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
    root: Path | str = field(default=Path("."), compare=False)   # a URI stays a string

    # ------------------------------------------------------------------ paths
    def path(self, relative: str) -> Path | str:
        return uri_files.join(self.root, relative)

    def image_files(self, source: str | None = None, split: str | None = None,
                    domain: str | None = None) -> list[Path | str]:
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

    def task_file(self, task: str, split: str) -> Path | str:
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
    def from_json(cls, d: dict, root: Path | str) -> "WorldManifest":
        d = dict(d)
        d["sources"] = {k: SourceInfo(**v) for k, v in d["sources"].items()}
        return cls(**d, root=root)


def load_manifest(folder: str | os.PathLike, check_files: bool = True) -> WorldManifest:
    """Read and check ``folder/manifest.json`` (``folder`` a local path or a URI); raise
    :class:`WorldError` when the folder is not a vlp world, the manifest is malformed, or
    (``check_files``) a file it lists is missing."""
    root = uri_files.location(folder)
    mpath = uri_files.join(root, MANIFEST_NAME)
    try:
        if uri_files.kind(root) != "dir":
            raise WorldError(f"{root}: no such folder")
        if uri_files.kind(mpath) != "file":
            raise WorldError(f"{root}: not a vlp world: no {MANIFEST_NAME} (an unfinished "
                             f"generation leaves none; make a world with `vlp data synth "
                             f"--out {root}`)")
        text = uri_files.read_bytes(mpath)
    except (uri_files.UriError, OSError) as e:    # storage unreachable, no bucket, no rights
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise WorldError(f"{root}: cannot read the world ({first})") from None
    try:
        raw = json.loads(text)
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
        _check_listed_files(m, mpath)
    return m


def _check_listed_files(m: WorldManifest, mpath: Path | str) -> None:
    listed = [f for i in m.sources.values() for fs in i.files.values() for f in fs]
    listed += [f for s in m.tasks.values() for f in s.values()]
    if uri_files.is_uri(m.root):     # one listing of the bucket, not a request per file
        try:
            have = uri_files.files_under(m.root)
        except (uri_files.UriError, OSError) as e:
            raise WorldError(f"{m.root}: cannot list the world's files ({e})") from None
        missing = (f for f in listed if posixpath.normpath(f) not in have)
    else:
        missing = (f for f in listed if not (m.root / f).is_file())
    first = next(missing, None)
    if first is not None:
        raise WorldError(f"{mpath}: lists {first} but the file is missing")
