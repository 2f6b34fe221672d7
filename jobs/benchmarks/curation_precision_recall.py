"""Curation benchmark: how well do the ImageBERT §3 filters remove the synthetic world's
unrelated alt-text, with rules alone and with a vlp model's ITM score?

Ground truth: ``meta/unrelated_pairs.json`` lists the out-of-domain (cc, sbu) pairs whose
caption does not describe its image (boilerplate web text, or another picture's caption).
For each filter setting the script curates cc and sbu and prints precision (removed pairs
that were unrelated) and recall (unrelated pairs removed), one figure per line:

    curation/<setting>/<source|all>/<precision|recall|removed> VALUE

The ITM model is a ``uniter-tiny`` trained here with ITM (+ MLM) on the in-domain sources
(coco, vg) only, by a plain single-process loop over the pipeline's local stream for
``--train-minutes`` on CPU (or ``--checkpoint`` one trained elsewhere: a weights file or a
vlp pretraining checkpoint folder). Its ITM accuracy on held-out in-domain batches is
printed too, so a weak filter can be told apart from a weak model.

    python jobs/benchmarks/curation_precision_recall.py --world /tmp/w --out /tmp/curation
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

SOURCES = ("cc", "sbu")
FAMILY = "uniter-tiny"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="/tmp/w", help="synthetic world (made at --scale if "
                                                      "missing)")
    p.add_argument("--scale", default="demo")
    p.add_argument("--out", default="/tmp/curation_bench", help="work folder")
    p.add_argument("--checkpoint", help="use this model instead of training one")
    p.add_argument("--train-minutes", type=float, default=4.0)
    p.add_argument("--min-itm-score", type=float, nargs="+", default=[0.5],
                   help="ITM thresholds to report (each is one setting)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def say(name: str, value) -> None:
    print(f"{name} {value}", flush=True)


# --------------------------------------------------------------------------- the ITM model

def train_itm_model(world, out: Path, minutes: float, seed: int) -> Path:
    """uniter-tiny, tasks itm:mlm = 2:1, on coco + vg, single process, CPU."""
    from vlp.datasets.curation.itm_checkpoint import save_model_card
    from vlp.datasets.data_config import DataConfig, SourceConfig
    from vlp.datasets.data_plan import plan_data
    from vlp.datasets.local_stream import local_batches
    from vlp.datasets.task_sampler import TaskSampler
    from vlp.models import create_model

    torch.manual_seed(seed)
    mix = {"itm": 2.0, "mlm": 1.0}
    sources = tuple(SourceConfig(s, str(world.root / world.sources[s].folder))
                    for s in world.pretraining_sources("in"))
    plan = plan_data(DataConfig(sources=sources, batch_units=2048, seed=seed), mix)
    model, _, _ = create_model(FAMILY, tasks=list(mix), region_feat_dim=world.feature_dim,
                               num_classes=world.num_classes,
                               overrides={"transformer.hidden_dropout": 0.0})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)
    batches, sampler = local_batches(plan), TaskSampler(mix, seed)
    model.train()
    start, step, recent = time.perf_counter(), 0, []
    while time.perf_counter() - start < minutes * 60:
        task = sampler.next()
        out_ = model(batches.next(task), task=task)
        opt.zero_grad(set_to_none=True)
        out_["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        step += 1
        if task == "itm":
            recent = (recent + [float(out_["itm_loss"].detach())])[-50:]
    batches.close()
    say("curation/itm_model/train_steps", step)
    say("curation/itm_model/train_seconds", round(time.perf_counter() - start, 1))
    say("curation/itm_model/itm_loss_last50", round(float(np.mean(recent)), 4))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "itm_model.pt"
    torch.save(model.state_dict(), path)
    save_model_card(out, FAMILY, tasks=list(mix), trained_on=list(world.pretraining_sources(
        "in")), steps=step)
    return path


def itm_accuracy(world, checkpoint: Path, seed: int, batches_n: int = 20) -> float:
    """ITM accuracy (random negatives, p=0.5) on in-domain batches with another seed."""
    from vlp.datasets import batch_spec as K
    from vlp.datasets.curation.itm_checkpoint import load_scoring_model
    from vlp.datasets.data_config import DataConfig, SourceConfig
    from vlp.datasets.data_plan import plan_data
    from vlp.datasets.local_stream import local_batches
    from vlp.models import predict

    scoring = load_scoring_model(checkpoint, region_feat_dim=world.feature_dim,
                                 num_classes=world.num_classes)
    sources = tuple(SourceConfig(s, str(world.root / world.sources[s].folder))
                    for s in world.pretraining_sources("in"))
    plan = plan_data(DataConfig(sources=sources, batch_units=2048, seed=seed + 1000), ["itm"])
    batches = local_batches(plan)
    right = total = 0
    for _ in range(batches_n):
        b = batches.next("itm")
        pred = predict(scoring.model, b)["itm_score"] > 0.5
        right += int((pred == b[K.ITM_LABELS].bool()).sum())
        total += len(pred)
    batches.close()
    return right / total


# --------------------------------------------------------------------------- measuring

def truth_of(world, source: str, pairs) -> np.ndarray:
    doc = json.loads((world.root / world.sidecars["unrelated_pairs"]).read_text())
    bad = {(p["image_id"], p["caption_index"]) for p in doc["pairs"] if p["source"] == source}
    return np.array([(pairs.image_id[pairs.image[p]], int(pairs.caption_index[p])) in bad
                     for p in range(pairs.num_pairs)])


def measure(world, out: Path, setting: str, filters: list[str], cfg, scorer=None,
            itm_info=None) -> None:
    from vlp.datasets.curation import curate_source

    total = {"tp": 0, "removed": 0, "truth": 0}
    for source in SOURCES:
        result = curate_source(world.root, source, out / setting, cfg, scorer=scorer,
                               filters=filters, overwrite=True, itm_info=itm_info)
        truth = truth_of(world, source, result.pairs)
        removed = result.removed_by != ""
        counts = {"tp": int((removed & truth).sum()), "removed": int(removed.sum()),
                  "truth": int(truth.sum())}
        _report(f"curation/{setting}/{source}", counts)
        for k in total:
            total[k] += counts[k]
    _report(f"curation/{setting}/all", total)


def _report(prefix: str, c: dict) -> None:
    say(f"{prefix}/removed", c["removed"])
    say(f"{prefix}/precision", round(c["tp"] / c["removed"], 4) if c["removed"] else "nan")
    say(f"{prefix}/recall", round(c["tp"] / c["truth"], 4) if c["truth"] else "nan")


def main(argv=None) -> int:
    from dataclasses import replace

    from vlp.datasets.curation import FILTERS, CurationConfig
    from vlp.datasets.curation.itm_checkpoint import load_scoring_model
    from vlp.datasets.curation.itm_scorer import ItmScorer
    from vlp.datasets.synth import generate_world
    from vlp.datasets.world import WorldError, load_manifest

    args = parse_args(argv)
    # on a shared 2-core machine two OpenMP threads spin-wait on each other: one thread
    # trained uniter-tiny ~20x faster there
    torch.set_num_threads(1)
    out = Path(args.out)
    try:
        world = load_manifest(args.world)
    except WorldError:
        generate_world(args.world, scale=args.scale, seed=args.seed)
        world = load_manifest(args.world)
    if "unrelated_pairs" not in world.sidecars:
        print(f"{args.world}: no unrelated_pairs sidecar (not a synthetic world)",
              file=sys.stderr)
        return 1
    say("curation/world", f"{world.name}")
    cfg = CurationConfig()
    rules = [n for n in FILTERS if n != "itm"]
    for name in rules:                        # each rule filter alone
        measure(world, out, name, [name], cfg)
    measure(world, out, "rules", rules, cfg)  # the rule-based pipeline

    checkpoint = Path(args.checkpoint) if args.checkpoint else train_itm_model(
        world, out / "model", args.train_minutes, args.seed)
    say("curation/itm_model/itm_accuracy_in_domain", round(itm_accuracy(world, checkpoint,
                                                                        args.seed), 4))
    scoring = load_scoring_model(checkpoint, region_feat_dim=world.feature_dim,
                                 num_classes=world.num_classes)
    scorer = ItmScorer(scoring, feature_dim=world.feature_dim, num_classes=world.num_classes)
    info = {"checkpoint": str(checkpoint), "family": scoring.preprocess.family,
            "load": scoring.summary}
    for t in args.min_itm_score:
        c = replace(cfg, min_itm_score=t)
        measure(world, out, f"itm@{t}", ["itm"], c, scorer, info)
        measure(world, out, f"rules+itm@{t}", list(FILTERS), c, scorer, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
