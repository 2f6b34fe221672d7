"""Files by URI: the one place a location such as ``s3://bucket/shards`` becomes a
``pyarrow.fs`` filesystem and a path inside it. Run storage (``vlp.platform.cluster.
run_storage``), shard folders (``vlp.datasets.storage.shards``) and weights read by URI all
go through here, so every reader finds the same endpoint.

Endpoints and credentials come only from the standard environment (``AWS_ENDPOINT_URL`` /
``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``, ... or the node's instance profile):
pyarrow's S3 client reads the keys but not the endpoint variable, so the endpoint is passed
here. A local path (``/abs``, ``rel/x``, ``file:///abs``) is not a URI.
"""

from __future__ import annotations

import os
import urllib.parse
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
