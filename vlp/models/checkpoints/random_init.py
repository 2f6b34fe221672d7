"""Random initialisation: BERT's N(0, 0.02) for Linear / Embedding, LayerNorm (1, 0).

Modules that know better initialise themselves: the ResNet keeps its Kaiming init (0.02 would
vanish the signal through a deep CNN) and embedders with loose parameters ([IMG], [MASK], …)
set them in ``init_extra_``. Tied parameters are shared objects, so initialising the word
embeddings initialises the MLM decoder too. Head output biases are created at zero (BERT).
"""

from __future__ import annotations

import torch
from torch import nn

from vlp.models.vision.resnet import ResNet
from vlp.models.vision.visual_dictionary import VisualDictionary


@torch.no_grad()
def init_bert_weights(model: nn.Module, std: float = 0.02) -> None:
    skip = {id(m) for r in model.modules() if isinstance(r, ResNet) for m in r.modules()}
    for module in model.modules():
        if id(module) in skip:
            continue
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, VisualDictionary):
            module.reset_parameters()
        if hasattr(module, "init_extra_"):
            module.init_extra_(std)
