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

import torch

from vlp.testing.grounding import attribute_accuracy


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
