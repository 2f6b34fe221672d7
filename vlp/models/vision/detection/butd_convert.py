"""The public BUTD weights (py-bottom-up-attention's R101-C4 "caffemaxpool" checkpoint,
detectron2 format) into :class:`ButdDetector`, key by key and shape by shape.

A checkpoint is a mapping from detectron2's parameter names to arrays, at the top level or
under ``"model"``: ``.pkl`` (detectron2's pickles of numpy arrays) or ``.pth`` / ``.pt``
(torch, loaded with ``weights_only=True``). A pickle is read by an unpickler that builds
only plain containers, numpy arrays and dtypes (``numpy ... _reconstruct``, ``ndarray``,
``dtype``, ``scalar``, ``collections.OrderedDict``, and ``_codecs.encode``, which protocol-2
pickles use for raw bytes) and refuses any other global, so a file cannot run code.

Every key of the model must be there with the model's shape; the attribute head is taken
when all its keys are there (the "attr" checkpoint) and left out when none is; the
GeneralizedRCNN buffers ``pixel_mean`` / ``pixel_std`` may be there or not, and when there
must be the normalisation vlp applies (Caffe's BGR means, std 1): images are prepared in
CPU workers that never read the checkpoint, so a checkpoint trained on other inputs is
refused rather than fed the wrong pixels. Anything else — a missing key, an unknown key, a
wrong shape — is one line each, all reported together, before any weights are copied.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import torch

from vlp.models.vision.detection.butd_config import ButdConfig, butd_config
from vlp.models.vision.detection.butd_model import ButdDetector
from vlp.models.vision.extractors.base import file_sha256

ATTRIBUTE_KEYS = ("roi_heads.box_predictor.cls_embedding.", "roi_heads.box_predictor.fc_attr.",
                  "roi_heads.box_predictor.attr_score.")
INPUT_KEYS = ("pixel_mean", "pixel_std")
MAX_LINES = 20

_NUMPY_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("collections", "OrderedDict"),
    ("_codecs", "encode"),
}


class _ArraysOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _NUMPY_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused: it refers to the global {module}.{name} "
                                     "(only numpy arrays and plain containers are read)")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused: it uses a persistent id")


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """name → tensor from a detectron2-format checkpoint; ValueError naming the file."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"{path}: no such file (a detectron2-format BUTD checkpoint, "
                         ".pkl or .pth)")
    try:
        if file.suffix == ".pkl":
            raw = _ArraysOnlyUnpickler(io.BytesIO(file.read_bytes()), encoding="latin1").load()
        elif file.suffix in (".pth", ".pt"):
            raw = torch.load(file, map_location="cpu", weights_only=True)
        else:
            raise ValueError(f"{path}: expected a .pkl, .pth or .pt checkpoint")
    except (pickle.UnpicklingError, EOFError, RuntimeError, AttributeError, ImportError,
            UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable checkpoint ({e})") from None
    if isinstance(raw, dict) and isinstance(raw.get("model"), dict):
        raw = raw["model"]
    if isinstance(raw, dict) and "blobs" in raw:
        raise ValueError(f"{path}: Caffe2-format blob names, not detectron2's layout")
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of parameter names to arrays, "
                         f"got {type(raw).__name__}")
    state = {}
    for key, value in raw.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "fiu":
            value = torch.from_numpy(np.ascontiguousarray(value))
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ValueError(f"{path}: entry {key!r} is a {type(value).__name__}, expected "
                             "a numeric array")
        state[key] = value
    return state


def weights_problems(state: dict[str, torch.Tensor], cfg: ButdConfig,
                     shown: str = "weights") -> list[str]:
    """One line per missing, unknown or mis-shaped key (empty when the weights fit)."""
    attributes = any(k.startswith(ATTRIBUTE_KEYS) for k in state)
    with torch.device("meta"):
        own = {k: tuple(v.shape) for k, v in ButdDetector(cfg, attributes).state_dict().items()}
    lines = [f"{shown}: missing key {k} (expected shape {shape})"
             for k, shape in own.items() if k not in state]
    for k, v in state.items():
        if k in INPUT_KEYS:
            want = cfg.pixel_mean_bgr if k == "pixel_mean" else (1.0, 1.0, 1.0)
            if v.numel() != 3:
                lines.append(f"{shown}: key {k} has shape {tuple(v.shape)}, expected 3 values "
                             "(one per BGR channel)")
            elif not torch.allclose(v.reshape(3).double().cpu(),
                                    torch.tensor(want, dtype=torch.float64), atol=1e-3):
                got = [round(x, 4) for x in v.reshape(3).tolist()]
                lines.append(f"{shown}: key {k} is {got}, expected {list(want)} (the BGR "
                             "normalisation images are prepared with)")
        elif k not in own:
            lines.append(f"{shown}: unknown key {k} (shape {tuple(v.shape)}): not part of the "
                         f"BUTD R101-C4 layout")
        elif tuple(v.shape) != own[k]:
            lines.append(f"{shown}: key {k} has shape {tuple(v.shape)}, expected {own[k]}")
    if len(lines) > MAX_LINES:
        lines = lines[:MAX_LINES] + [f"{shown}: and {len(lines) - MAX_LINES} more problems"]
    return lines


def check_butd_weights(path: str, size: str = "base") -> list[str]:
    """What is wrong with the checkpoint at ``path`` for the BUTD detector of ``size``, one
    line per problem (empty when it loads): the check to run before any actor starts."""
    try:
        state = read_checkpoint(path)
    except ValueError as e:
        return [str(e)]
    return weights_problems(state, butd_config(size), shown=str(path))


def load_butd_weights(path: str, cfg: ButdConfig) -> tuple[ButdDetector, str]:
    """(the detector with the checkpoint's weights, the file's sha256)."""
    state = read_checkpoint(path)
    problems = weights_problems(state, cfg, shown=str(path))
    if problems:
        raise ValueError("\n".join(problems))
    detector = ButdDetector(cfg, attributes=any(k.startswith(ATTRIBUTE_KEYS) for k in state))
    weights = {k: v for k, v in state.items() if k not in INPUT_KEYS}
    detector.load_state_dict(weights, strict=True)
    return detector, file_sha256(Path(path).expanduser())
