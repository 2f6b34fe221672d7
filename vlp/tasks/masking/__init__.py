"""Masking policies, one per pretraining task, in a registry by task name.

A policy turns an unmasked batch (numpy arrays keyed as in ``batch_spec``) into the masked
model input plus the targets of its task, in place. ``apply_masking`` adds the masking mode:
``conditional`` (UNITER: only the task's own modality is masked; ITM batches carry no masking)
or ``joint`` (UNITER Table 3 line 11: a masked task's batch masks the other modality too, at
random in the same example). Masked-modeling targets only ever fall on positive pairs.

Adding a task = one module that calls ``register_policy`` + its import below.
"""

from __future__ import annotations

from vlp.tasks.masking.registry import (MASKING_POLICIES, MaskContext, MaskingPolicy,
                                           apply_masking, get_policy, register_policy)
from vlp.tasks.masking import (itm, mlm, mlm_obj, moc, mrc_vlbert, mrm, mvm,  # noqa: F401
                                    mlm_text, sirp, wra)  # (register)

__all__ = ["MASKING_POLICIES", "MaskContext", "MaskingPolicy", "apply_masking", "get_policy",
           "register_policy"]
