"""The model-family registry: every family is one entry of data, built by one factory.

Sizes follow the papers: UNITER base 12/768/12/3072 and large 24/1024/16/4096; VL-BERT and
ImageBERT use BERT-base; SOHO's main model is ResNet-101 + 12 layers and its ablation model
ResNet-18 + 3 layers. ``*-minilm`` families are sized to the packaged MiniLM-L6-H384 so they
can start from its text-only weights (UNITER Table 3, line 2) on a laptop; ``*-tiny`` are
debug sizes for tests (hidden 64, 2 layers).
"""

from __future__ import annotations

from vlp.models.config import RESNET18, RESNET101, RESNET_TINY, FamilyConfig, ImageBertVisualConfig, SohoVisualConfig, TransformerConfig, UniterVisualConfig, VLBertVisualConfig

# mlm-obj (MLM on the words that name objects) is ours, not the papers': every family has MLM
UNITER_TASKS = ("mlm", "itm", "mrfr", "mrc", "mrc-kl", "wra", "mlm-obj")
IMAGEBERT_TASKS = ("mlm", "itm", "moc", "mrfr", "mlm-obj")
VLBERT_TASKS = ("mlm", "itm", "mrc-vlbert", "mlm-obj", "sirp", "mlm-text")
SOHO_TASKS = ("mlm", "itm", "mvm", "mlm-obj")

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
    FamilyConfig("uniter-base", BASE, UniterVisualConfig(), UNITER_TASKS),
    FamilyConfig("uniter-large", LARGE, UniterVisualConfig(), UNITER_TASKS),
    FamilyConfig("uniter-minilm", MINILM, UniterVisualConfig(), UNITER_TASKS),
    FamilyConfig("uniter-tiny", TINY, UniterVisualConfig(), UNITER_TASKS),
    # VL-BERT segments: A (sentence 1) = 0, B (sentence 2) = 1, C (image and [END]) = 2
    FamilyConfig("vlbert-base", _with_types(BASE, 3), VLBertVisualConfig(), VLBERT_TASKS),
    FamilyConfig("vlbert-minilm", _with_types(MINILM, 3), VLBertVisualConfig(), VLBERT_TASKS),
    FamilyConfig("vlbert-tiny", _with_types(TINY, 3), VLBertVisualConfig(geometry_dim=64),
                 VLBERT_TASKS),
    FamilyConfig("imagebert-base", BASE, ImageBertVisualConfig(), IMAGEBERT_TASKS),
    FamilyConfig("imagebert-minilm", MINILM, ImageBertVisualConfig(), IMAGEBERT_TASKS),
    FamilyConfig("imagebert-tiny", TINY, ImageBertVisualConfig(), IMAGEBERT_TASKS),
    FamilyConfig("soho-r18-l3", TransformerConfig(**{**BASE.__dict__, "num_layers": 3}),
                 SohoVisualConfig(resnet=RESNET18), SOHO_TASKS),
    FamilyConfig("soho-r101-l12", BASE, SohoVisualConfig(resnet=RESNET101), SOHO_TASKS),
    FamilyConfig("soho-r18-minilm", MINILM, SohoVisualConfig(resnet=RESNET18), SOHO_TASKS),
    FamilyConfig("soho-tiny", TINY, _SOHO_TINY, SOHO_TASKS),
)}


def get_family(name: str) -> FamilyConfig:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None
