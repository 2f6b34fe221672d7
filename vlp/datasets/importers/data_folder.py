"""The data folder (a *world*, see ``vlp.datasets.storage.world``) importers write, without
half-states.

Layout (the one ``vlp data synth`` writes too)::

    DIR/manifest.json                          the WorldManifest; written last
    DIR/images/<source>/<split>-00000.parquet  image shards of one corpus, grouped by split
    DIR/tasks/<task>/<split>.parquet           task tables
    DIR/meta/imports.jsonl                     one line per import: inputs, options, counts

An import builds its files in a hidden staging folder next to the target
(``.<name>.partial-<random>``; Arrow/Ray dataset readers skip hidden paths) and renames it
into place only when every file is complete; the manifest, through which everything
downstream finds its files, is updated after that. A failed import leaves the folder as it
was; a killed one leaves a hidden ``.partial`` folder that is plainly unfinished and that no
manifest lists.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from vlp.contract.atomic_write import write_json_atomic

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def safe_name(kind: str, name: str) -> str:
    """``name`` if it can be a folder/file name in the layout (no slashes, no leading dot)."""
    if not _SAFE_NAME.match(name or ""):
        raise ValueError(f"{kind} {name!r} cannot be used as a file name: use letters, digits "
                         f"and _ . + - (not starting with . or -)")
    return name


def images_dir(root: Path, source: str) -> Path:
    return Path(root) / "images" / safe_name("source", source)


def task_path(root: Path, task: str, split: str) -> Path:
    return Path(root) / "tasks" / safe_name("task", task) / f"{safe_name('split', split)}.parquet"


def refuse_existing(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass --overwrite to replace it")


def make_parents(folder: Path) -> list[Path]:
    """``mkdir -p folder``; the folders it created, outermost first (``remove_made`` takes
    them away again when the import fails: a bad input leaves no empty OUT/images/ behind)."""
    missing = []
    for p in [Path(folder), *Path(folder).parents]:
        if p.exists():
            break
        missing.append(p)
    Path(folder).mkdir(parents=True, exist_ok=True)
    return missing[::-1]


def remove_made(made: list[Path]) -> None:
    for p in reversed(made):
        try:
            p.rmdir()                   # only when empty: another import may have written
        except OSError:
            break


@contextlib.contextmanager
def staged_folder(final: Path, overwrite: bool) -> Iterator[Path]:
    """Yield an empty hidden folder; on success it replaces ``final`` in one rename."""
    final = Path(final)
    refuse_existing(final, overwrite)
    made = make_parents(final.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        remove_made(made)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.replaced-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_files(targets: list[Path], overwrite: bool) -> Iterator[list[Path]]:
    """Yield staging paths for several files; all are moved to ``targets`` only on success."""
    for t in targets:
        refuse_existing(Path(t), overwrite)
    if len(set(map(str, targets))) != len(targets):
        raise ValueError(f"two outputs would have the same name: {sorted(map(str, targets))}")
    parent = Path(targets[0]).parent if targets else Path(".")
    made = make_parents(parent)
    staging = Path(tempfile.mkdtemp(prefix=".import.partial-", dir=parent))
    try:
        yield [staging / f"{i}-{Path(t).name}" for i, t in enumerate(targets)]
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        remove_made(made)
        raise
    try:
        for i, t in enumerate(targets):
            Path(t).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / f"{i}-{Path(t).name}", t)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


DEFAULT_DOMAINS = {"coco": "in", "vg": "in", "cc": "out", "sbu": "out"}
IMPORT_LOG = "meta/imports.jsonl"


def default_domain(source: str) -> str:
    """UNITER's split: COCO and VG are in-domain, CC and SBU out-of-domain; any other corpus
    (flickr30k, nlvr2, vcr, ...) only serves downstream tasks."""
    return DEFAULT_DOMAINS.get(source, "downstream")


def read_world(root: Path):
    """The folder's WorldManifest, or None when it has none yet."""
    from vlp.datasets.storage.world import MANIFEST_NAME, load_manifest
    root = Path(root)
    if not (root / MANIFEST_NAME).exists():
        return None
    return load_manifest(root, check_files=False)


def require_world(root: Path):
    """The folder's manifest; a task import needs one (it records the feature width)."""
    from vlp.datasets.storage.world import MANIFEST_NAME
    world = read_world(root)
    if world is None:
        raise FileNotFoundError(
            f"{root} has no {MANIFEST_NAME}: import image features into it first (e.g. `vlp "
            f"data import butd-tsv FILE.tsv --source coco --out {root}`); the manifest records "
            f"their feature width")
    return world


def new_world(root: Path, *, feature_dim: int, num_classes: int, class_names: list[str],
              feature_extractor: str):
    from vlp.datasets.storage.world import WorldManifest
    return WorldManifest(name=Path(root).resolve().name, generator="vlp data import",
                         feature_dim=feature_dim, num_classes=num_classes,
                         class_names=class_names, feature_extractor=feature_extractor,
                         sources={}, tasks={}, root=Path(root))


def check_compatible(world, source: str, *, feature_dim: int, num_classes: int | None,
                     feature_extractor: str) -> None:
    """One world holds one feature width, one class set and one extractor: a model reads
    every source in it, and features of different extractors must not be mixed unknowingly."""
    if world is None:
        return
    others = [s for s in world.sources if s != source]
    if not others:
        return
    if world.feature_dim != feature_dim:
        raise ValueError(f"{world.root} holds {world.feature_dim}-d features (sources "
                         f"{others}); these are {feature_dim}-d: import them into another "
                         f"--out folder")
    if world.feature_extractor != feature_extractor:
        raise ValueError(f"{world.root} holds features of extractor "
                         f"{world.feature_extractor!r} (sources {others}); these are from "
                         f"{feature_extractor!r}: import them into another --out folder (or "
                         f"fix --feature-extractor if they are the same detector)")
    if num_classes and world.num_classes and world.num_classes != num_classes:
        raise ValueError(f"{world.root} holds soft labels over {world.num_classes} classes; "
                         f"these have {num_classes}: import them into another --out folder")


def update_world(root: Path, change: Callable, create: Callable | None = None,
                 log: dict | None = None):
    """Read-modify-write ``DIR/manifest.json`` under a lock (imports may run side by side).

    ``create()`` makes the manifest when the folder has none; without it a missing manifest
    is an error. ``log`` is appended to ``meta/imports.jsonl`` (the manifest has no room for
    provenance) before the manifest is written, so the manifest stays the last write.
    """
    from vlp.datasets.storage.world import MANIFEST_NAME
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".manifest.lock", "w") as lock:  # hidden: no reader looks at it
        fcntl.flock(lock, fcntl.LOCK_EX)
        world = read_world(root)
        if world is None:
            if create is None:
                require_world(root)
            world = create()
        change(world)
        if log is not None:
            (root / IMPORT_LOG).parent.mkdir(parents=True, exist_ok=True)
            with open(root / IMPORT_LOG, "a") as f:
                f.write(json.dumps(log, sort_keys=True) + "\n")
            world.sidecars["imports"] = IMPORT_LOG
        write_json_atomic(root / MANIFEST_NAME, world.to_json())
    return world


def import_record(importer: str, inputs: list[Path], counts: dict, options: dict,
                  outputs: list[str]) -> dict:
    """One line of ``meta/imports.jsonl``: what was imported from where (provenance, audits)."""
    return {"importer": importer,
            "inputs": [str(Path(p).resolve()) for p in inputs],
            "outputs": outputs,
            "options": {k: v for k, v in options.items() if v is not None},
            "counts": counts,
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
