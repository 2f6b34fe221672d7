"""The grounding probe: masked attribute words (colour, class) of the downstream retrieval
captions predicted by a model's MLM head with the caption's own image and with another image.
Equal accuracies mean the text predictions ignore the image. ``jobs/benchmarks/grounding_probe.py``
runs it on a checkpoint; ``grounding_curve.py`` along a pretraining run."""

from __future__ import annotations

import numpy as np
import torch


def attribute_accuracy(checkpoint: str, world: str, family: str = "uniter-tiny",
                       split: str = "val", captions: int = 1000) -> dict[str, float]:
    from vlp.datasets.storage.world import load_manifest
    from vlp.models import create_model
    from vlp.platform.training import pretrained_weights as ckpt

    weights = ckpt.read(checkpoint)
    if "heads.mlm.decoder.weight" not in weights.state and "heads.mlm.bias" not in weights.state:
        raise ValueError(f"{checkpoint}: no MLM head to probe")
    m = load_manifest(world)
    model, spec, _ = create_model(family, ["mlm", "itm"], region_feat_dim=m.feature_dim,
                                  num_classes=m.num_classes, vocab_size=weights.vocab_size)
    ckpt.load_into(model, weights)
    model.eval()
    return probe(model, spec, world, split, captions)


def probe(model, spec, world: str, split: str = "val", captions: int = 1000
          ) -> dict[str, float]:
    """The probe on a model in memory (in eval mode) whose ``create_model`` spec is ``spec``."""
    from vlp.contract import batch_spec as K
    from vlp.datasets.downstream import data_config_for
    from vlp.datasets.downstream.retrieval import RetrievalData
    from vlp.datasets.synth.vocabulary import CLASSES, COLOUR_NAMES

    data = RetrievalData(data_config_for(spec, world), split)
    tok = data.tok
    out: dict[str, float] = {}
    rng = np.random.default_rng(0)
    n = min(captions, len(data))
    for kind, vocab in (("colour", COLOUR_NAMES), ("class", CLASSES)):
        ids = torch.tensor([tok.tokenizer.token_to_id(w) for w in vocab])
        hits = {"true": [], "shuffled": []}
        for start in range(0, n, 100):
            idx = np.arange(start, min(start + 100, n))
            own = data.text_to_image[idx]
            other = (own + rng.integers(1, len(data.image_ids), len(idx))) % len(data.image_ids)
            for mode, cols in (("true", own), ("shuffled", other)):
                b = data.pair_batch(idx, cols)
                target = torch.isin(b[K.INPUT_IDS], ids)
                labels = b[K.INPUT_IDS][target]
                b[K.INPUT_IDS] = torch.where(target, tok.mask_id, b[K.INPUT_IDS])
                with torch.no_grad():
                    logits = model.heads["mlm"](model.backbone(b).select_text(target))
                pred = ids[logits[:, ids].argmax(1)]      # among the attribute words only
                hits[mode].append((pred == labels).float())
        for mode, v in hits.items():
            out[f"{kind}.{mode}"] = 100.0 * float(torch.cat(v).mean())
        out[f"{kind}.chance"] = 100.0 / len(vocab)
    return out
