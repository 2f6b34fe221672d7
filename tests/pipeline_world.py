"""Small image shards for the pipeline tests: random features (D=16), soft labels (C=8),
boxes with a spread of confidences, captions of varied length, optional PNG pixels."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from vlp.datasets.storage.shards import image_table, write_image_shard

WORDS = ("red blue green small large cube sphere cylinder left right of near a the on under "
         "shiny matte metal rubber behind front two three").split()
D, C = 16, 8


def _png(rng, h, w) -> bytes:
    from PIL import Image
    arr = rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def write_source(folder: Path, source: str, images: int, *, shards: int = 2, seed: int = 0,
                 pixels: bool = False, overlong_every: int = 0, min_words: int = 3,
                 max_words: int = 14, captions: tuple[int, int] = (1, 5),
                 val_every: int = 0) -> list[str]:
    """Write ``images`` rows into ``shards`` files; returns the image ids (train split)."""
    rng = np.random.default_rng(seed)
    rows, train_ids = [], []
    for i in range(images):
        n = int(rng.integers(3, 30))
        W, H = int(rng.integers(48, 200)), int(rng.integers(48, 200))
        x1 = rng.uniform(0, W - 8, n)
        y1 = rng.uniform(0, H - 8, n)
        boxes = np.stack([x1, y1, np.minimum(W, x1 + rng.uniform(4, W, n)),
                          np.minimum(H, y1 + rng.uniform(4, H, n))], 1)
        conf = rng.uniform(0, 0.15, n) if i % 7 == 0 else rng.uniform(0, 1, n)
        soft = rng.dirichlet(np.ones(C), n)
        caps = []
        for k in range(int(rng.integers(captions[0], captions[1] + 1))):
            words = 70 if overlong_every and (i * 5 + k) % overlong_every == 0 \
                else int(rng.integers(min_words, max_words + 1))
            caps.append(" ".join(rng.choice(WORDS, words)))
        split = "val" if val_every and i % val_every == 0 else "train"
        iid = f"{source}-{i:05d}"
        if split == "train":
            train_ids.append(iid)
        rows.append(dict(image_id=iid, source=source, split=split, width=W, height=H,
                         boxes=boxes, confidences=conf, features=rng.normal(size=(n, D)),
                         soft_labels=soft, captions=caps,
                         pixels=_png(rng, H, W) if pixels else None))
    per = -(-images // shards)
    for s in range(shards):
        part = rows[s * per:(s + 1) * per]
        if part:
            write_image_shard(folder / source / f"part-{s:05d}.parquet", image_table(part, D, C),
                              feature_extractor="test-random", feature_dim=D, num_classes=C)
    return train_ids
