"""MLM-obj: MLM whose masked words are the ones naming objects (the masking lives in
``vlp.tasks.masking.mlm_obj``). Same head (shared with MLM when both are trained) and loss;
its metrics are reported apart (``mlm-obj_loss``, ``mlm-obj_acc``) so a mix of both shows how
well object words, which need the image, are predicted."""

from __future__ import annotations

from vlp.tasks.base import register_task
from vlp.tasks.mlm import MaskedLanguageModeling


@register_task
class ObjectWordModeling(MaskedLanguageModeling):
    name = "mlm-obj"
    head_name = "mlm"
