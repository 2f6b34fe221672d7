"""The model stage of the job: a callable class that Ray Data runs as an actor pool, one
extractor per actor (loaded once), one GPU per actor on GPU nodes.

Each output row is built from the same input row it came from (image id, size and the
extractor's dict for that image travel together), so regions and features of one image can
never end up on another. Rows carry the encoded arrays the shard writer stores, and when the
model ran on their batch (wall clock, this node's), so that the job's steady rate is the model
stage's and not when results happen to reach the driver.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import torch

from vlp.models.vision.extractors.base import ExtractSettings
from vlp.platform.extract.given_boxes import decoded

RESULT_SCHEMA = pa.schema([
    ("image_id", pa.string()), ("location", pa.string()), ("error", pa.string()),
    ("width", pa.int32()), ("height", pa.int32()), ("num_boxes", pa.int32()),
    ("feature_dim", pa.int32()), ("num_classes", pa.int32()),
    ("boxes", pa.binary()),          # N·4 float32
    ("confidences", pa.binary()),    # N float32
    ("features", pa.binary()),       # N·D float16
    ("soft_labels", pa.binary()),    # N·C float32, or null
    ("image_feature", pa.binary()),  # D float16, or null
    ("pixels", pa.binary()),         # encoded image, or null
    ("model_start", pa.float64()),   # time.time() when the model took the row's batch
    ("model_end", pa.float64()),     # ... and when its outputs were on the host
    ("model_warm", pa.bool_()),      # not this actor's first batch (its warm-up)
])


def _bytes(a: np.ndarray | None, dtype: str) -> bytes | None:
    return None if a is None else np.ascontiguousarray(a, dtype=dtype).tobytes()


NO_CUDA = "extract: a model actor was given a GPU but torch sees no CUDA device"


class NoCudaError(RuntimeError):
    """A GPU actor whose torch cannot use its GPU (one line, ``NO_CUDA`` first)."""


def no_cuda_line() -> str:
    import os

    import ray

    try:
        ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    except Exception:
        ids = []
    return (f"{NO_CUDA} (Ray GPU ids {ids or '?'}, CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}; torch {torch.__version__}, "
            f"{'CUDA ' + torch.version.cuda if torch.version.cuda else 'a CPU-only build'}): "
            f"install a CUDA build of torch on the GPU nodes, or run with --workers N on CPUs")


class RunExtractor:
    """``map_batches`` class: ``(model, weights, settings)`` → an actor holding the model."""

    def __init__(self, model: str, weights: str | None, settings: ExtractSettings,
                 use_gpu: bool):
        from vlp.models.vision.extractors.registry import build_extractor
        from vlp.platform.training.gpu_placement import set_allocator
        from vlp.platform.training.weights_location import local_weights

        set_allocator()         # before this actor's first CUDA allocation
        if use_gpu and not torch.cuda.is_available():
            # no CPU fallback: the actor holds a GPU, and a CPU rate on a GPU cluster would
            # look like a working job
            raise NoCudaError(no_cuda_line())
        self.device = torch.device("cuda" if use_gpu else "cpu")
        local = local_weights(weights) if weights else None   # a URI: this node's copy
        self.extractor = build_extractor(model, local, settings).to(self.device).eval()
        self.batches = 0

    def _to_device(self, x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(x))
        if self.device.type == "cuda":   # pinned → asynchronous copy
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _run(self, idx: list[int], batch) -> dict[int, dict | str]:
        """Extractor outputs for rows ``idx``; if the batch fails, each image alone, so one
        bad image costs only itself."""
        inputs = [self._to_device(batch["input"][i]) for i in idx]
        scales = [float(batch["scale"][i]) for i in idx]
        sizes = [(int(batch["height"][i]), int(batch["width"][i])) for i in idx]
        # given boxes (--boxes): the image's regions are those, in original pixels
        given = ({} if "given_boxes" not in batch else
                 {"boxes": [decoded(batch["given_boxes"][i]) for i in idx]})
        try:
            return dict(zip(idx, self.extractor.extract(inputs, scales, sizes, **given)))
        except Exception as e:
            if len(idx) == 1:
                return {idx[0]: f"extractor failed: {type(e).__name__}: {e}"[:300]}
            out: dict[int, dict | str] = {}
            for i in idx:
                out.update(self._run([i], batch))
            return out

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        errors = [str(e) for e in batch["error"]]
        ok = [i for i, e in enumerate(errors) if not e]
        start = time.time()
        results = self._run(ok, batch) if ok else {}    # outputs on the host: the work done
        end, warm = time.time(), self.batches > 0
        self.batches += bool(ok)                        # a batch the model ran on
        cols: dict[str, list] = {f.name: [] for f in RESULT_SCHEMA}
        for i, image_id in enumerate(batch["image_id"]):
            r = results.get(i)
            if isinstance(r, str):
                errors[i] = r
                r = None
            feats = None if r is None else r["features"]
            soft = None if r is None else r.get("soft_labels")
            cols["image_id"].append(str(image_id))
            cols["location"].append(str(batch["location"][i]))
            cols["error"].append(errors[i])
            cols["width"].append(int(batch["width"][i]))
            cols["height"].append(int(batch["height"][i]))
            cols["num_boxes"].append(0 if r is None else int(r["boxes"].shape[0]))
            cols["feature_dim"].append(0 if feats is None else int(feats.shape[1]))
            cols["num_classes"].append(0 if soft is None else int(soft.shape[1]))
            cols["boxes"].append(None if r is None else _bytes(r["boxes"], "<f4"))
            cols["confidences"].append(None if r is None else _bytes(r["confidences"], "<f4"))
            cols["features"].append(_bytes(feats, "<f2"))
            cols["soft_labels"].append(_bytes(soft, "<f4"))
            cols["image_feature"].append(None if r is None
                                         else _bytes(r.get("image_feature"), "<f2"))
            pixels = None if r is None else r.get("pixels")
            cols["pixels"].append(None if pixels is None else pixels.tobytes())
            cols["model_start"].append(start)
            cols["model_end"].append(end)
            cols["model_warm"].append(warm)
        return pa.Table.from_pydict(cols, schema=RESULT_SCHEMA)


def decode_result(row: dict) -> dict:
    """A result row → the dict ``ImageShardWriter.add`` takes (source and split added later)."""
    n, d, c = row["num_boxes"], row["feature_dim"], row["num_classes"]
    soft = row["soft_labels"]
    whole = row["image_feature"]
    return {"image_id": row["image_id"], "width": row["width"], "height": row["height"],
            "boxes": np.frombuffer(row["boxes"], "<f4").reshape(n, 4),
            "confidences": np.frombuffer(row["confidences"], "<f4"),
            "features": np.frombuffer(row["features"], "<f2").reshape(n, d),
            "soft_labels": None if soft is None else np.frombuffer(soft, "<f4").reshape(n, c),
            "image_feature": None if whole is None else np.frombuffer(whole, "<f2"),
            "pixels": row["pixels"], "captions": None}
