"""Files by URI: the one place a location such as ``s3://bucket/shards`` becomes a
``pyarrow.fs`` filesystem and a path inside it. Run storage (``vlp.platform.cluster.
run_storage``), shard folders (``vlp.datasets.storage.shards``) and weights read by URI all
go through here, so every reader finds the same endpoint.

Endpoints and credentials come only from the standard environment (``AWS_ENDPOINT_URL`` /
``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``, ... or the node's instance profile):
pyarrow's S3 client reads the keys, and the endpoint variable only in recent versions, so the
endpoint is passed here. A local path (``/abs``, ``rel/x``, ``file:///abs``) is not a URI.

The small file operations below (``location``, ``join``, ``kind``, ``read_bytes``, ``glob``,
``files_under``) take either: a local path stays a ``Path`` (read as it always was), a URI
stays a string (``Path`` would fold ``s3://b`` into ``s3:/b``). A world folder is read
through them.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import urllib.parse
from pathlib import Path
from typing import Any


class UriError(ValueError):
    """A URI that cannot be opened; the message names it."""


def is_uri(where: str | os.PathLike) -> bool:
    """``s3://b/x`` yes; ``/abs``, ``rel/x``, ``file:///abs`` no (local)."""
    where = str(where)
    scheme = urllib.parse.urlparse(where).scheme
    return "://" in where and len(scheme) > 1 and scheme != "file"


def filesystem(uri: str) -> tuple[Any, str]:
    """(``pyarrow.fs`` filesystem, path inside it) of ``uri``. Raises ``UriError``."""
    import pyarrow.fs as pafs

    parsed = urllib.parse.urlparse(uri)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if parsed.scheme == "s3" and endpoint and not parsed.query:
        ep = urllib.parse.urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        fs = pafs.S3FileSystem(endpoint_override=ep.netloc, scheme=ep.scheme,
                               **({"region": region} if region else {}))
        return fs, f"{parsed.netloc}{parsed.path}"
    try:
        return pafs.FileSystem.from_uri(uri)
    except Exception as e:  # pyarrow: ArrowInvalid / OSError with the scheme named
        raise UriError(f"{uri}: pyarrow cannot open it ({e})") from None


def open_input(where: str | os.PathLike) -> Any:
    """What ``pyarrow.parquet`` reads from: a local path as it is, a URI as a random-access
    file of its filesystem."""
    if not is_uri(where):
        return str(where)
    fs, path = filesystem(str(where))
    return fs.open_input_file(path)


def location(where: str | os.PathLike) -> Path | str:
    """``where`` as the operations below take it: a ``Path`` when local, the URI string (no
    trailing '/') otherwise."""
    return str(where).rstrip("/") if is_uri(where) else Path(where)


def join(where: str | os.PathLike, *parts: str) -> Path | str:
    """``where/parts``: a ``Path`` for a local ``where``, a URI string for a URI."""
    base = location(where)
    return posixpath.join(base, *parts) if isinstance(base, str) else base.joinpath(*parts)


def parent(where: str | os.PathLike) -> Path | str:
    """The folder holding ``where`` (a ``Path``, or a URI string)."""
    return posixpath.dirname(str(where).rstrip("/")) if is_uri(where) else Path(where).parent


def kind(where: str | os.PathLike) -> str | None:
    """``"file"``, ``"dir"`` or None (nothing there). For a URI a "folder" is a prefix that
    holds objects. Raises ``UriError`` / ``OSError`` when the storage cannot be reached."""
    if not is_uri(where):
        p = Path(where)
        return "file" if p.is_file() else "dir" if p.is_dir() else None
    import pyarrow.fs as pafs

    fs, path = filesystem(str(where))
    t = fs.get_file_info(path.rstrip("/")).type
    return {pafs.FileType.File: "file", pafs.FileType.Directory: "dir"}.get(t)


def read_bytes(where: str | os.PathLike) -> bytes:
    if not is_uri(where):
        return Path(where).read_bytes()
    fs, path = filesystem(str(where))
    with fs.open_input_stream(path) as f:
        return f.read()


def glob(folder: str | os.PathLike, pattern: str) -> list[Path] | list[str]:
    """The entries of ``folder`` (not below it) whose names match ``pattern``, sorted."""
    if not is_uri(folder):
        return sorted(Path(folder).glob(pattern))
    import pyarrow.fs as pafs

    fs, path = filesystem(str(folder))
    found = fs.get_file_info(pafs.FileSelector(path.rstrip("/"), allow_not_found=True))
    names = [posixpath.basename(i.path) for i in found]
    return sorted(str(join(folder, n)) for n in names if fnmatch.fnmatch(n, pattern))


def files_under(folder: str | os.PathLike) -> set[str]:
    """Paths (relative, '/'-separated) of every file below ``folder``: one listing, where
    asking for each file would cost a request per file in object storage."""
    if not is_uri(folder):
        root = Path(folder)
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    import pyarrow.fs as pafs

    fs, path = filesystem(str(folder))
    path = path.rstrip("/")
    sel = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    return {posixpath.relpath(i.path, path) for i in fs.get_file_info(sel)
            if i.type == pafs.FileType.File}
