"""The synthetic V+L world: procedural scenes, a simulated detector, pretraining corpora in
UNITER's four styles and six downstream benchmarks on disjoint images.

    from vlp.datasets.synth import generate_world
    root = generate_world("worlds/demo", scale="demo", seed=0)
"""

from vlp.datasets.synth.generate import generate_world
from vlp.datasets.synth.scales import SCALES, ScaleConfig, get_scale

__all__ = ["generate_world", "SCALES", "ScaleConfig", "get_scale"]
