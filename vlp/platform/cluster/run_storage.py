"""Where runs live: a local folder or a URI on shared storage, in one place.

    storage = run_storage.resolve(cfg.run.storage, cfg.run.output_dir)   # "" → $VLP_STORAGE
    storage.uri("pretrain-tiny", "checkpoint_step00000020")   # s3://bucket/vlp/pretrain-...
    RunConfig(name=..., **storage.ray_storage())            # storage_path / storage_filesystem
    storage.latest_checkpoint_meta("pretrain-tiny")          # resume discovery

A location is a local path (made absolute) or any URI ``pyarrow.fs.FileSystem.from_uri``
resolves (``s3://``, ``gs://``, ``hdfs://``, ...), opened by ``vlp.contract.uri_files``
(endpoints and credentials only from the standard AWS environment or the node's instance
profile); a URI that carries credentials is refused (they would land in configs, logs and
MLflow params).

A run is found again by storage root + run name: the same root and name resume the same run,
whatever working folder the job was started from (``ray job submit`` unpacks every upload
into a new ``_ray_pkg_<hash>``).

On a multi-node cluster a local path is only shared when it is a mount every node has; a
relative path or one inside the job's working folder never is, and is refused before
anything starts (``check_shared``).
"""

from __future__ import annotations

import json
import os
import posixpath
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlp.contract.uri_files import UriError, filesystem, is_uri

STORAGE_ENV = "VLP_STORAGE"
TRAINER_META = "vlp_trainer.json"     # vlp/platform/training/checkpointing.py META_FILE


class StorageError(ValueError):
    """A run location that cannot be used; the message names it and what to set."""


def storage_root(configured: str, output_dir: str) -> str:
    """The runs root a job uses: the config's ``storage``, else ``$VLP_STORAGE``, else the
    local ``output_dir``."""
    return configured or os.environ.get(STORAGE_ENV, "") or output_dir


@dataclass(frozen=True)
class RunStorage:
    root: str            # absolute local path, or the URI as given (no trailing '/')
    given: str           # what the user wrote (for messages and the relative-path check)
    fs: Any              # pyarrow.fs.FileSystem
    fs_root: str         # ``root`` as a path inside ``fs``

    @property
    def is_local(self) -> bool:
        return not is_uri(self.root)

    def uri(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts) if parts else self.root

    def fs_path(self, *parts: str) -> str:
        return posixpath.join(self.fs_root, *parts) if parts else self.fs_root

    def ray_storage(self) -> dict[str, Any]:
        """``RunConfig`` keywords: a local root as a plain path (Ray's own handling); a URI
        as our filesystem (endpoint from the environment) and the path inside it."""
        if self.is_local:
            return {"storage_path": self.root}
        return {"storage_path": self.fs_root, "storage_filesystem": self.fs}

    # ---- small file operations (pyarrow.fs: local and remote alike) ---------------------

    def create_root(self) -> None:
        self.fs.create_dir(self.fs_root, recursive=True)

    def exists(self, *parts: str) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.fs_path(*parts)).type != pafs.FileType.NotFound

    def read_text(self, *parts: str) -> str:
        return self.read_bytes(*parts).decode()

    def read_bytes(self, *parts: str) -> bytes:
        with self.fs.open_input_stream(self.fs_path(*parts)) as f:
            return f.read()

    def delete(self, *parts: str) -> None:
        self.fs.delete_file(self.fs_path(*parts))

    def write_text(self, text: str, *parts: str) -> None:
        """Atomic: written under a temporary name, then moved (a rename locally, a server-side
        copy on S3), so a reader never finds a half-written file under the final name (a
        stream closed by an error would otherwise publish what it had)."""
        self.write_bytes(text.encode(), *parts)

    def write_bytes(self, data: bytes, *parts: str) -> None:
        """Atomic, as ``write_text``."""
        self._publish(lambda out: out.write(data), *parts)

    def upload(self, local: str | Path, *parts: str) -> None:
        """The local file ``local`` copied in, atomically (see ``write_text``)."""
        def copy(out: Any) -> None:
            with open(local, "rb") as src:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
        self._publish(copy, *parts)

    def _publish(self, write: Any, *parts: str) -> None:
        path = self.fs_path(*parts)
        self.fs.create_dir(posixpath.dirname(path), recursive=True)
        tmp = posixpath.join(posixpath.dirname(path),
                             f".{posixpath.basename(path)}.{os.getpid()}.part")
        try:
            with self.fs.open_output_stream(tmp) as f:
                write(f)
            self.fs.move(tmp, path)
        except BaseException:
            try:
                self.fs.delete_file(tmp)
            except OSError:
                pass
            raise

    def subfolders(self, *parts: str) -> list[str]:
        """Names of the folders directly under ``parts`` ([] when it does not exist)."""
        import pyarrow.fs as pafs

        sel = pafs.FileSelector(self.fs_path(*parts), allow_not_found=True)
        return sorted(posixpath.basename(i.path) for i in self.fs.get_file_info(sel)
                      if i.type == pafs.FileType.Directory)

    def latest_checkpoint_meta(self, *run: str) -> dict[str, Any] | None:
        """The trainer meta (``vlp_trainer.json``) of the newest vlp checkpoint in the run
        folder ``run`` (none: the root itself), with that checkpoint's URI under ``"uri"``;
        None when there is none."""
        best = None
        for name in self.subfolders(*run):
            if name.startswith("checkpoint_") and self.exists(*run, name, TRAINER_META):
                meta = json.loads(self.read_text(*run, name, TRAINER_META))
                if best is None or meta["step"] > best["step"]:
                    best = {**meta, "uri": self.uri(*run, name)}
        return best


def resolve(configured: str = "", output_dir: str = "runs") -> RunStorage:
    """The storage of a job from its config (``storage``, ``output_dir``) and the
    environment; see ``storage_root``."""
    return open_location(storage_root(configured, output_dir))


def open_location(where: str) -> RunStorage:
    """A ``RunStorage`` rooted at ``where`` (local path or URI). Raises ``StorageError``."""
    import pyarrow.fs as pafs

    where = where.strip()
    if not where:
        raise StorageError("run storage: expected a folder or a URI, got ''")
    if not is_uri(where):
        local = where[len("file://"):] if where.startswith("file://") else where
        root = str(Path(local).expanduser().resolve())
        return RunStorage(root, where, pafs.LocalFileSystem(), root)
    parsed = urllib.parse.urlparse(where)
    if parsed.username or parsed.password:
        raise StorageError(
            f"run storage {parsed.scheme}://…@{parsed.hostname}{parsed.path}: credentials do "
            f"not belong in a URI (they would reach configs, logs and MLflow); set "
            f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or the node's instance profile)")
    root = where.rstrip("/")
    try:
        fs, path = filesystem(root)
    except UriError as e:
        raise StorageError(f"run storage {e}") from None
    return RunStorage(root, where, fs, path.rstrip("/"))


# ---- multi-node rules -------------------------------------------------------------------

def alive_nodes() -> int:
    """Alive nodes of the Ray cluster this process is attached to (0: not attached)."""
    try:
        import ray

        if not ray.is_initialized():
            return 0
        return sum(1 for n in ray.nodes() if n.get("Alive"))
    except Exception:  # no Ray, or the GCS not answering: do not guess a cluster
        return 0


def check_shared(storage: RunStorage, nodes: int | None = None,
                 workdir: str | Path | None = None, why: str = "", what: str = "run storage",
                 fix: str = "set VLP_STORAGE=s3://<bucket>/runs (cluster.yaml exports it on "
                             "every node) or run.storage") -> None:
    """On a job spanning more than one node (``nodes``; ``job_nodes.job_span`` counts them
    after Ray is attached, ``why`` says why), refuse a local root that cannot be shared: a
    relative path, or one inside the job's working folder (``ray job submit`` unpacks it on
    the head only, under a name that changes with every code edit)."""
    nodes = alive_nodes() if nodes is None else nodes
    if nodes <= 1 or not storage.is_local:
        return
    work = Path(workdir or os.getcwd()).resolve()
    given = storage.given[len("file://"):] if storage.given.startswith("file://") \
        else storage.given
    relative = not Path(given).expanduser().is_absolute()
    inside = Path(storage.root) == work or work in Path(storage.root).parents
    if relative or inside:
        where = "a relative path" if relative else f"inside the job's working folder {work}"
        span = why or f"a {nodes}-node cluster"
        raise StorageError(
            f"{what} {storage.given!r} is {where}, which other nodes cannot read, and "
            f"this job spans nodes ({span}): {fix}, or an absolute path on a mount every "
            f"node shares")


# ---- reading a checkpoint from a URI ----------------------------------------------------

def local_copy(uri: str, files: list[str], cache: str | Path | None = None) -> Path:
    """Download ``files`` (paths relative to the folder ``uri``) into a local cache folder
    keyed by the URI and return it; files already there are not fetched again. Written under
    a temporary name and renamed, so an interrupted download never looks complete."""
    import hashlib

    storage = open_location(uri)
    base = Path(cache or os.environ.get("VLP_CACHE", "~/.cache/vlp")).expanduser()
    folder = base / "storage" / hashlib.sha1(storage.root.encode()).hexdigest()[:16]
    for rel in files:
        dest = folder / rel
        if dest.is_file():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        with storage.fs.open_input_stream(storage.fs_path(rel)) as src, open(tmp, "wb") as out:
            while chunk := src.read(1 << 22):
                out.write(chunk)
        os.replace(tmp, dest)
    return folder


def location_exists(path: str) -> bool:
    """A local path, or a URI in shared storage (``s3://bucket/weights.pt``); an unreachable
    storage counts as missing."""
    if not is_uri(path):
        return Path(path).expanduser().exists()
    try:
        return open_location(path).exists()
    except (OSError, StorageError):
        return False
