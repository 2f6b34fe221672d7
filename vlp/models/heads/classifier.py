"""[CLS]-classifiers: VQA (soft scores over answers, BCE) and SNLI-VE (3 classes, CE).

Head (UNITER): Linear(H, 2H) → GELU → LayerNorm → Linear(2H, #outputs) on the pooled [CLS].
VQA loss: BCE-with-logits per answer, *summed* over answers and averaged over questions —
UNITER's ``bce(...).mean() * num_answers``; with 3129 answers a mean over answers would
shrink the gradient 3129-fold.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vlp.contract import downstream_keys as D
from vlp.contract.batch_access import require

from vlp.models.heads.head import Batch, DownstreamHead, accuracy, encode, mlp


class SoftScoreClassifier(DownstreamHead):
    """VQA: multi-label over the answer vocabulary, soft targets. ``from_token`` False: on the
    pooled [CLS] (UNITER); True: on the output of the token at ``answer_position`` (VL-BERT's
    appended [MASK], §4.2.2), not pooled."""

    def __init__(self, name: str, hidden: int, num_answers: int, eps: float = 1e-12,
                 from_token: bool = False):
        super().__init__()
        self.name = name
        self.from_token = from_token
        self.mlp = mlp(hidden, 2 * hidden, num_answers, eps)

    def predict(self, backbone, batch: Batch) -> torch.Tensor:
        if not self.from_token:
            return self.mlp(encode(backbone, batch).pooled_output)
        enc = backbone(batch, pool=False)
        position = require(batch, D.ANSWER_POSITION, "VQA from the [MASK] token").long()
        rows = torch.arange(position.shape[0], device=position.device)
        return self.mlp(enc.sequence_output[rows, enc.text_positions[rows, position]])

    def losses(self, backbone, batch: Batch) -> dict[str, torch.Tensor]:
        logits = self.predict(backbone, batch).float()
        targets = batch[D.TARGETS].float()
        loss = F.binary_cross_entropy_with_logits(logits, targets) * targets.shape[1]
        # the soft score of the predicted answer: the training-time view of VQA accuracy
        picked = targets.gather(1, logits.detach().argmax(1, keepdim=True)).mean()
        return {f"{self.name}_loss": loss, f"{self.name}_score": picked}


class ClassClassifier(DownstreamHead):
    """SNLI-VE (and any single-label [CLS] task): CE over ``num_classes``."""

    def __init__(self, name: str, hidden: int, num_classes: int, eps: float = 1e-12):
        super().__init__()
        self.name = name
        self.mlp = mlp(hidden, 2 * hidden, num_classes, eps)

    def predict(self, backbone, batch: Batch) -> torch.Tensor:
        return self.mlp(encode(backbone, batch).pooled_output)

    def losses(self, backbone, batch: Batch) -> dict[str, torch.Tensor]:
        logits = self.predict(backbone, batch).float()
        labels = batch[D.LABELS].long()
        return {f"{self.name}_loss": F.cross_entropy(logits, labels),
                f"{self.name}_acc": accuracy(logits, labels)}
