"""MLM-obj: masked language modeling aimed at the words that name objects (ours, not the
papers'; every family has it).

BERT's masking picks 15% of word pieces at random, so most targets (articles, relations,
words the rest of the caption gives away) can be predicted from text alone; the few that
need the image carry little of the loss. Bitton et al. (2021, "Data Efficient Masked
Language Modeling for Vision and Language") showed that masking object tokens instead makes
MLM use the image. Here: in each positive pair whose caption names a detector class, exactly
one of those words is masked (uniformly among them); captions that name none fall back to
BERT's 15%. The masked words then go through BERT's 80/10/10 corruption. The object words are
the detector class names of the data (``DataPlan.object_words``), so the task works on any
world whose classes have names.

Head and loss are MLM's (the head is shared with MLM when both are trained); its metrics are
reported apart (``mlm-obj_loss``, ``mlm-obj_acc``) so a mix of both shows how well object
words, which need the image, are predicted.
"""

from __future__ import annotations

import numpy as np

from vlp.contract import batch_spec as K
from vlp.tasks.masking_select import choose_positions
from vlp.tasks.masking_text import corrupt_chosen, maskable_words
from vlp.tasks.mlm import MaskedLanguageModeling
from vlp.tasks.registry import register
from vlp.tasks.spec import ArrayBatch, MaskContext


def choose_object_words(batch: ArrayBatch, rng: np.random.Generator,
                        ctx: MaskContext) -> np.ndarray:
    """One object word per row that has any; BERT's 15% (at least one) in rows with none."""
    words = maskable_words(batch, ctx)
    objects = words & np.isin(batch[K.INPUT_IDS], ctx.object_ids)
    has_object = objects.any(axis=1)
    # the largest uniform score among a row's object words picks one of them uniformly
    scores = np.where(objects, rng.random(objects.shape), -1.0)
    chosen = np.zeros_like(words)
    rows = np.flatnonzero(has_object)
    chosen[rows, scores[rows].argmax(axis=1)] = True
    rest = words & ~has_object[:, None]
    return chosen | choose_positions(rest, ctx.mask_prob, rng)


@register
class ObjectWordModeling(MaskedLanguageModeling):
    name, label, order = "mlm-obj", "MLM-obj", 9
    head_name = "mlm"
    object_words = True

    def mask(self, batch: ArrayBatch, rng: np.random.Generator, ctx: MaskContext) -> None:
        corrupt_chosen(batch, choose_object_words(batch, rng, ctx), rng, ctx)
