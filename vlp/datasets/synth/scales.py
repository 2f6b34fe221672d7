"""The one scale knob of the synthetic world: how many images, how wide the features.

Proportions follow UNITER's Table 1 (COCO: ~5 captions per image; VG: many region phrases
per image; CC and SBU: one alt-text per image, more images than the in-domain sets) shrunk
so that ``demo`` generates in well under a minute-and-a-half on two cores. Downstream train
sets are kept small next to the pretraining corpus on purpose: pretraining (captions that
teach which feature directions mean which words) then has room to beat training from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScaleConfig:
    name: str
    image_size: int                       # rendered canvas side in pixels (square)
    feature_dim: int                      # region feature width D
    pretrain_images: dict[str, int]       # source → images (split "train")
    downstream_images: dict[str, int]     # split → images of the disjoint downstream pool
    images_per_shard: int
    pixels: bool = True                   # store PNG bytes in the image shards
    # downstream examples drawn per image (NLVR2: per image of the split, as pairs)
    vqa_per_image: int = 2
    ve_per_image: int = 2
    refexp_per_image: int = 2
    vcr_per_image: int = 1
    nlvr2_per_image: float = 1.25
    retrieval_captions: int = 5
    notes: tuple[str, ...] = field(default=())

    @property
    def total_images(self) -> int:
        return sum(self.pretrain_images.values()) + sum(self.downstream_images.values())


SCALES: dict[str, ScaleConfig] = {
    # unit tests: a few hundred images, D=64, generates in a second or two
    "tiny": ScaleConfig(
        name="tiny", image_size=64, feature_dim=64,
        pretrain_images={"coco": 80, "vg": 40, "cc": 48, "sbu": 32},
        downstream_images={"train": 40, "val": 20, "test": 20},
        images_per_shard=50),
    # the laptop demo and the CPU demo sweep: a few thousand pretraining images, D=256
    "demo": ScaleConfig(
        name="demo", image_size=96, feature_dim=256,
        pretrain_images={"coco": 1600, "vg": 800, "cc": 1200, "sbu": 800},
        downstream_images={"train": 800, "val": 200, "test": 200},
        images_per_shard=1000),
    # a GPU cluster: BUTD feature width 2048, tens of thousands of images (~2 GB of features)
    "full": ScaleConfig(
        name="full", image_size=128, feature_dim=2048,
        pretrain_images={"coco": 16000, "vg": 8000, "cc": 24000, "sbu": 8000},
        downstream_images={"train": 8000, "val": 1000, "test": 1000},
        images_per_shard=2000),
}


def get_scale(name: str) -> ScaleConfig:
    try:
        return SCALES[name]
    except KeyError:
        raise ValueError(f"unknown scale {name!r}; choose one of {sorted(SCALES)}") from None
