"""The model-family registry: every family is one entry of data, built by one factory.

Sizes follow the papers: UNITER base 12/768/12/3072 and large 24/1024/16/4096; VL-BERT and
ImageBERT use BERT-base; SOHO's main model is ResNet-101 + 12 layers and its ablation model
ResNet-18 + 3 layers. ``*-minilm`` families are sized to the packaged MiniLM-L6-H384 so they
can start from its text-only weights (UNITER Table 3, line 2) on a laptop; ``*-tiny`` are
debug sizes for tests (hidden 64, 2 layers).
"""

from __future__ import annotations

from vlp.models.family_config import (RESNET18, RESNET101, RESNET_TINY, FamilyConfig,
                                      ImageBertVisualConfig, SohoVisualConfig, TransformerConfig,
                                      UniterVisualConfig, VLBertVisualConfig)
from vlp.tasks.registry import visual_problem

BASE = TransformerConfig(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072)
LARGE = TransformerConfig(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096)
MINILM = TransformerConfig(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536)
# BERT's init std 0.02 is tuned for width 768 (0.02·√768 ≈ 0.55 per projection output); at
# width 64 it leaves attention near uniform, and image-text grounding never starts on a CPU
# budget (itm_toy.py, grounding_probe.py). The tiny sizes keep BERT-base's scale instead.
TINY = TransformerConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256,
                         initializer_range=round(0.02 * (768 / 64) ** 0.5, 4))


def _with_types(t: TransformerConfig, n: int) -> TransformerConfig:
    return TransformerConfig(**{**t.__dict__, "type_vocab_size": n})


_SOHO_TINY = SohoVisualConfig(resnet=RESNET_TINY, dictionary_size=64,
                              image_min_side=192, image_max_side=256)

FAMILIES: dict[str, FamilyConfig] = {f.name: f for f in (
    FamilyConfig("uniter-base", BASE, UniterVisualConfig()),
    FamilyConfig("uniter-large", LARGE, UniterVisualConfig()),
    FamilyConfig("uniter-minilm", MINILM, UniterVisualConfig()),
    FamilyConfig("uniter-tiny", TINY, UniterVisualConfig()),
    # VL-BERT segments: A (sentence 1) = 0, B (sentence 2) = 1, C (image and [END]) = 2
    FamilyConfig("vlbert-base", _with_types(BASE, 3), VLBertVisualConfig()),
    FamilyConfig("vlbert-minilm", _with_types(MINILM, 3), VLBertVisualConfig()),
    FamilyConfig("vlbert-tiny", _with_types(TINY, 3), VLBertVisualConfig(geometry_dim=64)),
    FamilyConfig("imagebert-base", BASE, ImageBertVisualConfig(), objective="summed"),
    FamilyConfig("imagebert-minilm", MINILM, ImageBertVisualConfig(), objective="summed"),
    FamilyConfig("imagebert-tiny", TINY, ImageBertVisualConfig(), objective="summed"),
    FamilyConfig("soho-r18-l3", TransformerConfig(**{**BASE.__dict__, "num_layers": 3}),
                 SohoVisualConfig(resnet=RESNET18), objective="summed"),
    FamilyConfig("soho-r101-l12", BASE, SohoVisualConfig(resnet=RESNET101), objective="summed"),
    FamilyConfig("soho-r18-minilm", MINILM, SohoVisualConfig(resnet=RESNET18), objective="summed"),
    FamilyConfig("soho-tiny", TINY, _SOHO_TINY, objective="summed"),
)}


def get_family(name: str) -> FamilyConfig:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None


def family_task_problem(task: str, family: str) -> str | None:
    """Why registered ``task`` does not apply to ``family``, naming the families it applies
    to and, where the family reads another visual input, that; None when it applies."""
    fam = get_family(family)
    if task in fam.tasks:
        return None
    kinds = sorted({f.visual.kind for f in FAMILIES.values() if task in f.tasks})
    why = f"a task of {', '.join(kinds)}" if kinds else "no family has it"
    visual = visual_problem(task, fam.visual.input_kind, family)
    return (f"task {task!r} does not apply to {family} ({why}); its tasks: "
            f"{', '.join(fam.tasks)}" + (f"; {visual}" if visual else ""))
