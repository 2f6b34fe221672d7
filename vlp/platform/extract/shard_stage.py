"""The last stage of the job, run by Ray Data's workers: up to ``--images-per-shard`` result
rows → one shard, validated by the project's shard writer and written to the output URI (an
``s3://`` prefix or a folder every node mounts) from the worker that holds the rows.

What goes on to the driver is one small row per shard written (its name, row count, feature
width, class count, the node that wrote it) and one per image that failed: the driver
commits the manifest and never holds a feature array.

A shard's name carries a random token (``SPLIT-<token>-00000.parquet``): workers write side by
side with no numbering to agree on. A local shard is written under a temporary name and
renamed; an object store makes an object visible only once its upload completes. Either way a
listed file is whole, and only the manifest (written by the driver after the shard) says the
run has it.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import pyarrow as pa

from vlp.contract.uri_files import filesystem, is_uri, join

COMMIT_SCHEMA = pa.schema([
    ("shard", pa.string()),        # OUT-relative path of a shard written, or null
    ("rows", pa.int32()),
    ("feature_dim", pa.int32()),
    ("num_classes", pa.int32()),
    ("node", pa.string()),         # the Ray node that wrote it
    ("location", pa.string()),     # an image that failed, or null
    ("error", pa.string()),
    # the model stage's work in this batch after each actor's first batch (its warm-up):
    # images, the first start and the last end (wall clock), on the batch's first shard row
    ("warm_images", pa.int32()),
    ("warm_start", pa.float64()),
    ("warm_end", pa.float64()),
])


def images_location(out: str, source: str) -> Path | str:
    return join(out, "images", source)


def _node_id() -> str:
    try:
        import ray
        return ray.get_runtime_context().get_node_id()
    except Exception:
        return ""


def _upload(local: Path, uri: str) -> None:
    fs, path = filesystem(uri)
    with fs.open_output_stream(path) as f, open(local, "rb") as src:
        while block := src.read(8 << 20):
            f.write(block)


class WriteShards:
    """``map_batches`` function (a callable instance: Ray runs it as tasks)."""

    def __init__(self, out: str, source: str, split: str, extractor: str,
                 meta: dict[str, str]):
        self.out, self.source, self.split = out, source, split
        self.extractor, self.meta = extractor, meta

    def __call__(self, batch: pa.Table) -> pa.Table:
        from vlp.datasets.importers.image_writer import ImageShardWriter, Record
        from vlp.datasets.importers.import_error import InputFormatError
        from vlp.platform.extract.model_stage import decode_result

        cols: dict[str, list] = {f.name: [] for f in COMMIT_SCHEMA}

        def emit(**values) -> None:
            for f in COMMIT_SCHEMA:
                cols[f.name].append(values.get(f.name))

        target = images_location(self.out, self.source)
        token = f"{self.split}-{uuid.uuid4().hex[:12]}"
        with tempfile.TemporaryDirectory(prefix="vlp-shard-") as tmp:
            # a mounted folder is written in place (atomic rename); a URI through a local file
            folder = Path(tmp) if is_uri(self.out) else Path(target)
            folder.mkdir(parents=True, exist_ok=True)
            writer = ImageShardWriter(folder, self.extractor, token, self.meta,
                                      target_bytes=1 << 62)
            rows = batch.to_pylist()
            warm = [r for r in rows if r["model_warm"] and not r["error"]]
            timing = dict(warm_images=len(warm),
                          warm_start=min((r["model_start"] for r in warm), default=None),
                          warm_end=max((r["model_end"] for r in warm), default=None))
            for row in rows:
                if row["error"]:
                    emit(location=row["location"], error=row["error"])
                    continue
                try:
                    writer.add({**decode_result(row), "source": self.source,
                                "split": self.split}, Record(Path(row["location"]), "extracted"))
                except InputFormatError as e:   # the extractor's output broke the format
                    emit(location=row["location"], error=str(e))
            for info in writer.close():
                name = Path(info.path).name
                if is_uri(self.out):
                    _upload(Path(info.path), str(join(target, name)))
                emit(shard=f"images/{self.source}/{name}", rows=info.num_rows,
                     feature_dim=info.feature_dim, num_classes=info.num_classes or 0,
                     node=_node_id(), **timing)
                timing = {}                 # counted once, on the first shard
        return pa.Table.from_pydict(cols, schema=COMMIT_SCHEMA)
