"""A simulated bottom-up detector: boxes, confidences, soft class labels and region features.

What it imitates, and why:
- Boxes are the objects' boxes jittered, plus what a real detector also returns: near-duplicate
  boxes NMS left behind, boxes on object parts, boxes around two objects, boxes on empty
  background; a few objects are missed. Regions come sorted by confidence, as BUTD's do.
- Soft labels over C = classes + 1 (index 0 = background) come from noisy class evidence with
  look-alike confusions, so top-1 accuracy lands near a real detector's (~80%).
- Features of width D are a fixed random two-layer network (tanh then ReLU, so features are
  non-negative and sparse like pooled CNN features) applied to a latent that blends what the
  box covers: the detector's class belief, the perceived colour (true colour + lighting cast +
  noise, through a random Fourier map), material evidence, box size and position, and nuisance
  noise. Attributes are therefore recoverable from features, but only by learning a nonlinear
  map, and never perfectly: exactly what caption pretraining should teach a model.

The network's weights depend only on the detector version and D (not on the world's seed),
like one BUTD model used across data sets: worlds of different seeds share a feature space.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from vlp.datasets.synth.scene import Scene
from vlp.datasets.synth.vocabulary import CLASSES, COLOURS, COLOUR_NAMES, CONFUSABLE, MATERIALS

NUM_CLASSES = len(CLASSES) + 1                 # C, index 0 = background
CLASS_NAMES = ("__background__",) + CLASSES
_RGB = np.array([COLOURS[c] for c in COLOUR_NAMES])
_CONFUSE = np.array([CLASSES.index(CONFUSABLE[c]) for c in CLASSES])


@dataclass(frozen=True)
class DetectorConfig:
    feature_dim: int
    version: str = "synth-detector-v1"
    hidden: int = 128
    miss_rate: float = 0.03          # objects with no box at all
    duplicate_rate: float = 0.15     # a second, looser box on the same object
    part_rate: float = 0.2           # a box on half an object
    group_rate: float = 0.3          # per image: a box around two neighbouring objects
    background_boxes: tuple[int, int] = (1, 3)
    box_jitter: float = 0.06         # σ of corner jitter, fraction of the object's side
    class_gain: float = 5.0          # logit of the true class for a box tight on the object
    background_gain: float = 5.0
    confusion: float = 4.6           # max extra logit on the look-alike class
    class_noise: float = 1.2         # σ of logit noise on every class
    colour_noise: float = 0.12       # σ of perceived-colour noise (RGB in 0..1)
    material_noise: float = 0.9      # σ of material-evidence noise
    feature_noise: float = 0.25      # σ of noise added before the final ReLU

    @property
    def name(self) -> str:
        return f"{self.version}-d{self.feature_dim}"


@dataclass
class Detection:
    """One image's regions, sorted by confidence (descending)."""
    boxes: np.ndarray         # (R, 4) float32 pixels
    confidences: np.ndarray   # (R,) float32
    soft_labels: np.ndarray   # (R, C) float32, rows sum to 1
    latent: np.ndarray        # (R, LATENT) what the feature network sees
    objects: np.ndarray       # (R,) int: scene object with IoU ≥ 0.5, or -1 (background)
    kinds: list[str]          # object | duplicate | part | group | background
    features: np.ndarray | None = None   # (R, D) float32, non-negative; see featurize()


class SimulatedDetector:
    LATENT = 16 + 16 + len(MATERIALS) + 2 + 4 + 8   # class, colour, material, size, pos, nuisance

    def __init__(self, cfg: DetectorConfig):
        self.cfg = cfg
        seed = int.from_bytes(hashlib.sha256(cfg.name.encode()).digest()[:8], "little")
        g = np.random.default_rng(seed)
        self.class_emb = g.normal(0, 1, (NUM_CLASSES, 16))
        self.colour_w = g.normal(0, 3.0, (3, 16))
        self.colour_b = g.uniform(0, 2 * np.pi, 16)
        self.w1 = g.normal(0, 1.6 / np.sqrt(self.LATENT), (self.LATENT, cfg.hidden))
        self.b1 = g.normal(0, 0.3, cfg.hidden)
        self.w2 = g.normal(0, 2.0 / np.sqrt(cfg.hidden), (cfg.hidden, cfg.feature_dim))
        self.b2 = g.normal(-0.3, 0.3, cfg.feature_dim)
        self._w2, self._b2 = self.w2.astype(np.float32), self.b2.astype(np.float32)

    # ------------------------------------------------------------------ boxes
    def propose(self, scene: Scene, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
        c, s = self.cfg, scene.canvas
        boxes, kinds = [], []
        for o in scene.objects:
            w, h = o.box[2] - o.box[0], o.box[3] - o.box[1]
            scale = np.array([w, h, w, h])
            if rng.random() >= c.miss_rate:
                boxes.append(o.box + rng.normal(0, c.box_jitter, 4) * scale)
                kinds.append("object")
            if rng.random() < c.duplicate_rate:
                boxes.append(o.box + rng.normal(0, 2.5 * c.box_jitter, 4) * scale)
                kinds.append("duplicate")
            if rng.random() < c.part_rate:
                half = o.box.copy()
                k = int(rng.integers(4))        # keep the left/top/right/bottom half
                half[(k + 2) % 4] = (o.box[k % 2] + o.box[k % 2 + 2]) / 2
                boxes.append(half)
                kinds.append("part")
        if len(scene.objects) >= 2 and rng.random() < c.group_rate:
            i, j = rng.choice(len(scene.objects), 2, replace=False)
            a, b = scene.objects[i].box, scene.objects[j].box
            boxes.append(np.concatenate([np.minimum(a[:2], b[:2]), np.maximum(a[2:], b[2:])]))
            kinds.append("group")
        for _ in range(int(rng.integers(c.background_boxes[0], c.background_boxes[1] + 1))):
            side = rng.uniform(0.12, 0.4, 2) * s
            x, y = rng.uniform(0, s - side[0]), rng.uniform(0, s - side[1])
            boxes.append(np.array([x, y, x + side[0], y + side[1]]))
            kinds.append("background")
        b = np.clip(np.array(boxes, np.float64), 0, s)
        b[:, 2] = np.maximum(b[:, 2], np.minimum(b[:, 0] + 2, s))
        b[:, 3] = np.maximum(b[:, 3], np.minimum(b[:, 1] + 2, s))
        b[:, 0] = np.minimum(b[:, 0], b[:, 2] - 2)
        b[:, 1] = np.minimum(b[:, 1], b[:, 3] - 2)
        return b, kinds

    # ------------------------------------------------------------------ detect
    def detect(self, scene: Scene, rng: np.random.Generator) -> Detection:
        boxes, kinds = self.propose(scene, rng)
        return self.describe(scene, boxes, kinds, rng)

    def describe(self, scene: Scene, boxes: np.ndarray, kinds: list[str],
                 rng: np.random.Generator, sort: bool = True) -> Detection:
        """Class evidence and feature latents of given ``boxes``: the detector's second
        stage. ``detect`` runs it on its proposals; the ground-truth-box features of
        RefCOCO+ (UNITER's gt setting) run it on the annotated boxes, in their order
        (``sort=False``)."""
        c = self.cfg
        boxes = np.asarray(boxes, np.float64)
        obj_boxes = np.array([o.box for o in scene.objects], np.float64)
        inter = _intersection(boxes, obj_boxes)                       # (R, K)
        area_r = _area(boxes)[:, None]
        area_o = _area(obj_boxes)[None, :]
        share = inter / area_r                                        # part of the box
        total = share.sum(1, keepdims=True)
        share = share / np.maximum(total, 1.0)                        # overlapping objects
        coverage = np.sqrt(inter / area_o)                            # part of the object seen
        bg = 1.0 - share.sum(1)
        r = len(boxes)

        cls = np.array([o.cls for o in scene.objects])
        logits = rng.normal(0, c.class_noise, (r, NUM_CLASSES))
        logits[:, 0] += c.background_gain * bg
        evidence = share * coverage * c.class_gain                    # (R, K)
        np.add.at(logits.T, 1 + cls, evidence.T)
        lookalike = evidence * rng.uniform(0, c.confusion / c.class_gain, evidence.shape)
        np.add.at(logits.T, 1 + _CONFUSE[cls], lookalike.T)
        soft = _softmax(logits)
        conf = soft[:, 1:].max(1)

        light = scene.lighting
        obj_rgb = np.array([_RGB[o.colour] for o in scene.objects]) + light
        obj_rgb = obj_rgb + rng.normal(0, c.colour_noise, obj_rgb.shape)
        bg_rgb = np.asarray(scene.background) + light + rng.normal(0, c.colour_noise, (r, 3))
        rgb = share @ obj_rgb + bg[:, None] * bg_rgb
        mat_obj = np.eye(len(MATERIALS))[[o.material for o in scene.objects]] * 1.5
        mat = share @ mat_obj + rng.normal(0, c.material_noise, (r, len(MATERIALS)))
        s = scene.canvas
        wh = (boxes[:, 2:] - boxes[:, :2]) / s
        size = np.stack([np.log(wh[:, 0] * wh[:, 1]) / 1.5 + 2.0, np.log(wh[:, 0] / wh[:, 1])], 1)
        pos = np.concatenate([(boxes[:, :2] + boxes[:, 2:]) / (2 * s) * 2 - 1, wh * 2 - 0.5], 1)
        latent = np.concatenate([
            soft @ self.class_emb, np.sin(rgb @ self.colour_w + self.colour_b), mat, size, pos,
            rng.normal(0, 0.7, (r, 8))], 1)

        iou = inter / (area_r + area_o - inter)
        owner = np.where(iou.max(1) >= 0.5, iou.argmax(1), -1)
        order = np.argsort(-conf, kind="stable") if sort else np.arange(r)
        return Detection(boxes[order].astype(np.float32), conf[order].astype(np.float32),
                         soft[order].astype(np.float32), latent[order], owner[order],
                         [kinds[i] for i in order])

    def featurize(self, detections: list[Detection], rngs: list[np.random.Generator]) -> None:
        """Fill in ``features`` for many images at once, each with noise from its own stream.

        One large matrix product per shard instead of one small one per image: at D=2048 the
        per-image products cost more in BLAS threading overhead than in arithmetic.
        """
        if not detections:
            return
        latent = np.concatenate([d.latent for d in detections])
        h = np.tanh(latent @ self.w1 + self.b1).astype(np.float32)
        x = h @ self._w2 + self._b2
        start = 0
        for d, rng in zip(detections, rngs):
            part = x[start:start + len(d.latent)]
            start += len(d.latent)
            part += self.cfg.feature_noise * rng.standard_normal(part.shape, dtype=np.float32)
            d.features = 2.0 * np.maximum(part, 0.0)


def _area(b: np.ndarray) -> np.ndarray:
    return (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])


def _intersection(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(hi - lo, 0, None)
    return wh[..., 0] * wh[..., 1]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)
