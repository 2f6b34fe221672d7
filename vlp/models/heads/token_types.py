"""Token-type layouts of the downstream tasks that need more types than pretraining had.

UNITER (text 0, image 1): NLVR2's triplet adds a type for the second image, copied from the
image row; VCR adds answer and rationale types, copied from the text row (question 0,
image 1, answer 2, rationale 3). VL-BERT (A 0, B 1, image C 2) needs no new row for VCR:
Q→A is question A, answer B; QA→R is question + answer A, rationale B (§4.2.1); NLVR2 adds a
type for the second image, copied from C. The pretrained rows
stay untouched, so a model with the extended table reproduces pretraining on pretraining
inputs.
"""

from __future__ import annotations

from vlp.models.backbone import VLBackbone
from vlp.models.family_config import FamilyConfig

IMAGE_TYPE = {"uniter": 1, "imagebert": 1, "soho": 1, "vlbert": 2}
LAYOUTS = ("nlvr2-triplet", "vcr")


def layout_types(family: FamilyConfig, layout: str) -> tuple[list[int], dict[str, tuple]]:
    """(rows to append, each copied from an existing row; the type ids the data adapter
    uses: ``image_types`` (first, second image) or ``vcr_types`` (per stage: the type of
    each segment, q2a (question, answer), qa2r (question, answer, rationale))) — a pure
    function of the family, so data and model agree without talking."""
    kind = family.visual.kind
    n = family.transformer.type_vocab_size
    image = IMAGE_TYPE[kind]
    if layout == "nlvr2-triplet":
        if kind == "soho":
            raise ValueError("NLVR2 triplet puts two images' regions in one sequence; SOHO "
                             "embeds one image per example: use the pair or pair-biattn variant")
        return [image], {"image_types": (image, n)}
    if layout == "vcr":
        if kind == "vlbert":
            # VL-BERT §4.2.1: Q→A puts the question in A and the answer in B; QA→R puts the
            # question and answer, concatenated, in A and the rationale in B
            return [], {"vcr_types": {"q2a": (0, 1), "qa2r": (0, 0, 1)}}
        return [0, 0], {"vcr_types": {"q2a": (0, n), "qa2r": (0, n, n + 1)}}
    raise ValueError(f"unknown token-type layout {layout!r}; known: {', '.join(LAYOUTS)}")


def extend_for(backbone: VLBackbone, layout: str) -> dict[str, tuple]:
    """Extend ``backbone``'s table for ``layout``; returns the adapter's type ids. A backbone
    already extended for the same layout (UNITER's VCR second-stage pretraining extends it
    before the VCR finetune does) is left as it is."""
    rows, ids = layout_types(backbone.family, layout)
    have = backbone.text_embeddings.token_type_embeddings.num_embeddings
    base = backbone.family.transformer.type_vocab_size
    if rows and have == base + len(rows) and getattr(backbone, "token_type_layout", "") == layout:
        return ids
    if have != base:
        raise ValueError(f"the token-type table already has {have} rows (extended twice?)")
    if rows:
        backbone.text_embeddings.extend_token_types(rows)
        backbone.token_type_layout = layout
    return ids


def extra_type_rows(family: FamilyConfig, layout: str | None) -> int:
    """Rows ``layout`` appends to ``family``'s token-type table (0 for None)."""
    return len(layout_types(family, layout)[0]) if layout else 0
