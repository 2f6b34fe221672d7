"""Does a pretrained model read the image? Masked attribute words of the downstream
retrieval captions (colour, class) predicted by the checkpoint's MLM head with the caption's
own image and with another image: equal accuracies mean the text predictions ignore the image
(no grounding), whatever the MLM loss says.

    python jobs/benchmarks/grounding_probe.py --checkpoint runs/calibration/pretrain-... \
        --world runs/calibration/world

Prints one figure per line: ``grounding.<attr>.<true|shuffled|chance> value``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch


def attribute_accuracy(checkpoint: str, world: str, family: str = "uniter-tiny",
                       split: str = "val", captions: int = 1000) -> dict[str, float]:
    from vlp.datasets.storage.world import load_manifest
    from vlp.models import create_model
    from vlp.platform.finetune import checkpoint as ckpt

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--world", required=True)
    p.add_argument("--family", default="uniter-tiny")
    args = p.parse_args()
    torch.set_num_threads(1)
    for k, v in attribute_accuracy(args.checkpoint, args.world, args.family).items():
        print(f"grounding.{k} {v:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
