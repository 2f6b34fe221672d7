"""``vlp data extract --boxes SOURCE``: the boxes an extraction featurises instead of the
model's own regions (MAttNet's detections for RefCOCO+ val^d, ground-truth boxes, another
detector's output).

SOURCE is ``mattnet:<dataset>``, the MAttNet detections ``vlp data import mattnet-dets``
wrote into the ``--out`` world (its manifest sidecar ``mattnet_dets.<dataset>``), or a
Parquet file (a path or a URI) with a column ``image_id`` (the importers' spelling: COCO's
integer id or a file stem) and a column ``boxes``: per image x1, y1, x2, y2 in the original
image's pixels (after its EXIF orientation: the shard's width and height), flat (4·N floats,
the importer's layout) or as N lists of 4.

Everything the file alone can tell is checked before Ray starts (``read_given_boxes``,
``check_listing``): one id twice, a box that is not 4 finite numbers, a degenerate box (x2 ≤
x1 or y2 ≤ y1), a corner left of or above the image, and a listed image with no given boxes
(refused, not written with 0 regions: the shard format needs a region, and a silently empty
image would score nothing). Whether a box ends inside its image needs the image's size: the
decode stage checks it (``box_outside``), and such an image is one failed line of the report
naming the image and the box, the others go on.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

import numpy as np

from vlp.datasets.storage.shard_format import BOX_TOLERANCE

MATTNET = "mattnet:"
COLUMNS = ("image_id", "boxes")


@dataclass(frozen=True)
class GivenBoxes:
    source: str                      # as given: mattnet:refcoco+ or the file
    path: str                        # the Parquet file read
    sha256: str
    boxes: dict[str, np.ndarray]     # canonical image id → (N, 4) float32, in file order

    @property
    def identity(self) -> str:
        """What every shard records (``given_boxes``): a rerun with other boxes is refused."""
        return f"{self.source} sha256={self.sha256}"

    def encoded(self, image_id: str) -> bytes:
        """One image's boxes as the job carries them: N·4 little-endian float32."""
        return np.ascontiguousarray(self.boxes[image_id], "<f4").tobytes()

    def describe(self) -> str:
        n = sum(len(b) for b in self.boxes.values())
        return (f"given boxes {self.source} ({len(self.boxes)} images, {n} boxes; no RPN, NMS "
                f"or confidence filter)")


def decoded(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, "<f4").reshape(-1, 4)


def _resolve(source: str, out: str) -> str:
    """The Parquet file ``source`` names."""
    if not source.startswith(MATTNET):
        return source
    from vlp.contract.uri_files import join
    from vlp.datasets.importers.mattnet_dets import DATASETS, SIDECAR
    from vlp.platform.extract.shard_sink import load_world

    dataset = source[len(MATTNET):]
    if dataset not in DATASETS:
        raise ValueError(f"--boxes {source}: unknown MAttNet dataset {dataset!r}; known: "
                         f"{', '.join(DATASETS)}")
    try:
        world = load_world(out)
    except OSError as e:
        raise ValueError(f"--boxes {source}: cannot read the world {out} "
                         f"({str(e).splitlines()[0]})") from None
    rel = world.sidecars.get(SIDECAR.format(dataset=dataset)) if world else None
    if rel is None:
        raise ValueError(f"--boxes {source}: the world {out} has no MAttNet detections for "
                         f"{dataset} (import them first: vlp data import mattnet-dets "
                         f"res101_coco_minus_refer_notime_dets.json --dataset {dataset} "
                         f"--out {out})")
    return str(join(out, rel))


def _image_boxes(path: str, row: int, image_id: str, value) -> np.ndarray:
    where = f"{path}: row {row} (image {image_id!r})"
    if value is None:
        return np.zeros((0, 4), np.float32)
    if value and isinstance(value[0], (list, tuple)):
        if any(v is None or len(v) != 4 for v in value):
            raise ValueError(f"{where}: boxes {value!r}: expected lists of 4 numbers "
                             f"(x1, y1, x2, y2)")
        flat = [x for v in value for x in v]
    else:
        flat = list(value)
        if len(flat) % 4:
            raise ValueError(f"{where}: {len(flat)} box values, expected 4 per box (x1, y1, "
                             f"x2, y2)")
    if any(x is None for x in flat):
        raise ValueError(f"{where}: a box value is null")
    boxes = np.asarray(flat, np.float64).reshape(-1, 4)
    for k, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
        box = f"{where}: box {k} [{x1:g}, {y1:g}, {x2:g}, {y2:g}]"
        if not np.isfinite([x1, y1, x2, y2]).all():
            raise ValueError(f"{box}: expected finite numbers")
        if x2 <= x1 or y2 <= y1:
            raise ValueError(f"{box} is degenerate: expected x1 < x2 and y1 < y2 (corners, "
                             f"original pixels)")
        if x1 < -BOX_TOLERANCE or y1 < -BOX_TOLERANCE:
            raise ValueError(f"{box} lies outside the image (a corner left of or above it)")
    return boxes.astype(np.float32)


def read_given_boxes(source: str, out: str) -> GivenBoxes:
    """The boxes ``source`` names, checked; ``ValueError`` with one line naming the file, the
    row, the image and the box."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from vlp.contract.uri_files import UriError, read_bytes
    from vlp.datasets.importers.image_ids import canonical_image_id

    path = _resolve(source, out)
    try:
        data = read_bytes(path)
    except (OSError, ValueError, UriError) as e:
        raise ValueError(f"--boxes {source}: cannot read {path} ({str(e).splitlines()[0]})"
                         ) from None
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"--boxes {source}: {path} is not a Parquet file "
                         f"({str(e).splitlines()[0]})") from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r} (expected columns image_id and "
                         f"boxes: x1, y1, x2, y2 in original pixels; has "
                         f"{', '.join(table.column_names)})")
    boxes: dict[str, np.ndarray] = {}
    first_row: dict[str, int] = {}
    ids = table.column("image_id").to_pylist()
    for row, (raw, value) in enumerate(zip(ids, table.column("boxes").to_pylist())):
        if raw is None or isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise ValueError(f"{path}: row {row}: image_id {raw!r}, expected an integer or a "
                             f"string")
        image_id = canonical_image_id(raw)
        if image_id in first_row:
            raise ValueError(f"{path}: row {row}: image {image_id!r} again (first at row "
                             f"{first_row[image_id]}): one row per image")
        first_row[image_id] = row
        boxes[image_id] = _image_boxes(path, row, image_id, value)
    if not boxes:
        raise ValueError(f"--boxes {source}: {path} holds no images")
    return GivenBoxes(source, path, hashlib.sha256(data).hexdigest(), boxes)


def check_listing(given: GivenBoxes, refs) -> None:
    """Every image to extract has given boxes, or one line naming how many do not and the
    first."""
    lacking = [r for r in refs if len(given.boxes.get(r.image_id, ())) == 0]
    if lacking:
        first = lacking[0]
        raise ValueError(f"--boxes {given.source}: {len(lacking)} of {len(refs)} images to "
                         f"extract have no given boxes (e.g. image {first.image_id!r}, "
                         f"{first.location}): with --boxes an image gets the given boxes "
                         f"only; list just the images that have some (--image-list)")


def box_outside(boxes: np.ndarray, width: int, height: int) -> str | None:
    """Why a given box does not fit its decoded image (None when every box does): the
    shard format's tolerance, one pixel."""
    far = ((boxes[:, 2] > width + BOX_TOLERANCE) | (boxes[:, 3] > height + BOX_TOLERANCE)
           | (boxes[:, 0] < -BOX_TOLERANCE) | (boxes[:, 1] < -BOX_TOLERANCE))
    if not far.any():
        return None
    k = int(np.flatnonzero(far)[0])
    x1, y1, x2, y2 = boxes[k].tolist()
    return (f"given box {k} [{x1:g}, {y1:g}, {x2:g}, {y2:g}] lies outside the {width}x{height} "
            f"image ({int(far.sum())} of {len(boxes)} boxes do)")
