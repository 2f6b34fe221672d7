"""Curation benchmark: how well do the ImageBERT §3 filters remove the synthetic world's
unrelated alt-text, with rules alone and with a vlp model's ITM score?

Ground truth: ``meta/unrelated_pairs.json`` lists the out-of-domain (cc, sbu) pairs whose
caption does not describe its image (boilerplate web text, or another picture's caption).
For each filter setting the script curates cc and sbu and prints precision (removed pairs
that were unrelated) and recall (unrelated pairs removed), one figure per line:

    curation/<setting>/<source|all>/<precision|recall|removed> VALUE

The ITM model is a ``uniter-tiny`` pretrained here with ITM + MLM on the in-domain sources
(coco, vg) only: by the platform's pretraining job (``--trainer platform``: Ray Train +
DeepSpeed, one CPU worker; the curation then reads its checkpoint folder) or by a plain
single-process loop over the pipeline's local stream (``--trainer local``, the default),
for ``--train-steps`` steps; or ``--checkpoint`` names one trained elsewhere.

Why the local loop draws its own ITM negatives: the pipeline swaps in a donor image (or
text) only where the new pair fits the batch's longest packed row, so its negatives are
shorter than its positives (on the demo world, "positive if the row is at least the batch's
median length" is right 85% of the time). A model learns that cue first, and it tells
nothing about a real pair. The local loop asks the pipeline for positive pairs only and
swaps the image of half of them with another example's (regions are padded to the batch's
longest, so any swap fits): negatives then have the positives' length distribution. The
platform trainer inherits the pipeline's negatives. The ITM accuracy printed (in-domain
batches of another seed, negatives drawn like the local loop's, so no length cue) tells a
weak filter from a weak model.

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
    p.add_argument("--trainer", choices=["platform", "local"], default="local")
    p.add_argument("--train-steps", type=int, default=6000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-itm-score", type=float, nargs="+", default=[0.3, 0.5],
                   help="ITM thresholds to report (each is one setting)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def say(name: str, value) -> None:
    print(f"{name} {value}", flush=True)


# --------------------------------------------------------------------------- the ITM model

MIX = {"itm": 3.0, "mlm": 1.0}
BATCH_UNITS = 2048


def in_domain_sources(world) -> dict[str, str]:
    return {s: str(world.root / world.sources[s].folder) for s in world.pretraining_sources("in")}


def train_platform(world, out: Path, steps: int, lr: float, seed: int) -> Path:
    """The platform's pretraining job (Ray Train + DeepSpeed, one CPU worker)."""
    import ray

    from vlp.platform.curation.itm_checkpoint import save_model_card
    from vlp.platform.pretrain.job import load_pretrain_config, pretrain

    if not ray.is_initialized():   # a logically larger CPU count: on 2 cores Ray Data deadlocks
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    cfg = load_pretrain_config(data={
        "run": {"name": "curation-itm", "output_dir": str(out), "seed": seed},
        "model": {"family": FAMILY, "dropout": 0.0},
        "data": {"sources": {n: {"path": p} for n, p in in_domain_sources(world).items()},
                 "batch_input_units": BATCH_UNITS},
        "tasks": MIX, "train": {"steps": steps, "log_every": max(1, steps // 10)},
        "optimizer": {"lr": lr, "warmup_steps": max(1, steps // 20)},
        "scaling": {"num_workers": 1}, "checkpoint": {"interval": steps},
        "mlflow": {"enabled": False}})
    start = time.perf_counter()
    result = pretrain(cfg, progress=False, say=lambda line: None)
    say("curation/itm_model/train_seconds", round(time.perf_counter() - start, 1))
    say("curation/itm_model/train_steps", result.final_step)
    say("curation/itm_model/itm_loss_final", round(float(result.metrics.get(
        "itm_loss", float("nan"))), 4))
    save_model_card(result.run_dir, FAMILY, tasks=list(MIX), trainer="platform")
    return Path(result.checkpoint_path)


def train_local(world, out: Path, steps: int, lr: float, seed: int) -> Path:
    """The same recipe in one process over the pipeline's local stream (no Ray)."""
    from vlp.platform.curation.itm_checkpoint import save_model_card
    from vlp.datasets.stream.data_config import DataConfig, SourceConfig
    from vlp.datasets.stream.data_plan import plan_data
    from vlp.datasets.stream.local_stream import local_batches
    from vlp.datasets.batching.task_sampler import TaskSampler
    from vlp.models import create_model
    from vlp.platform.training.engine import WarmupLinearDecay, param_groups

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    sources = tuple(SourceConfig(n, p) for n, p in in_domain_sources(world).items())
    plan = plan_data(DataConfig(sources=sources, batch_units=BATCH_UNITS, seed=seed,
                                itm_neg_prob=0.0), MIX)
    model, _, _ = create_model(FAMILY, tasks=list(MIX), region_feat_dim=world.feature_dim,
                               num_classes=world.num_classes,
                               overrides={"transformer.hidden_dropout": 0.0,
                                          "transformer.attention_dropout": 0.0})
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=lr, betas=(0.9, 0.98), eps=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, WarmupLinearDecay(max(1, steps // 20),
                                                                     steps))
    batches, sampler = local_batches(plan, with_ids=True), TaskSampler(MIX, seed)
    start, recent = time.perf_counter(), []
    try:
        for _ in range(steps):
            task = sampler.next()
            batch = batches.next(task)
            if task == "itm":
                batch = swap_images(batch, rng)
            loss = model(batch, task=task)
            opt.zero_grad(set_to_none=True)
            loss["loss"].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            sched.step()
            if task == "itm":
                recent = (recent + [float(loss["itm_loss"].detach())])[-50:]
    finally:
        batches.close()
    say("curation/itm_model/train_seconds", round(time.perf_counter() - start, 1))
    say("curation/itm_model/train_steps", steps)
    say("curation/itm_model/itm_loss_final", round(float(np.mean(recent)), 4))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "itm_model.pt"
    torch.save(model.state_dict(), path)
    save_model_card(out, FAMILY, tasks=list(MIX), trainer="local", steps=steps)
    return path


def swap_images(batch: dict, rng: np.random.Generator, neg_prob: float = 0.5) -> dict:
    """ITM negatives without a length cue: the regions of half the (positive) pairs are
    replaced by those of a random example showing another image."""
    from vlp.contract import batch_spec as K
    from vlp.datasets.batching.task_batch import EXAMPLE_IMAGE_KEY

    image = batch[EXAMPLE_IMAGE_KEY].numpy()
    B = len(image)
    donor = np.arange(B)
    for i in np.flatnonzero(rng.random(B) < neg_prob):
        others = np.flatnonzero(image != image[i])
        if len(others):
            donor[i] = rng.choice(others)
    idx = torch.from_numpy(donor)
    out = dict(batch)
    # the collate's host lengths describe the unswapped rows: the model measures them again
    for key in (K.ROW_LENGTH, K.REAL_UNITS, K.MLM_TARGETS, K.REGION_TARGETS):
        out.pop(key, None)
    for key in (K.REGION_FEATS, K.REGION_LOC, K.REGION_MASK):
        out[key] = batch[key][idx]
    negative = torch.from_numpy(donor != np.arange(B))
    out[K.ITM_LABELS] = (~negative).long()
    out[K.POSITIVE] = ~negative
    return out


def itm_accuracy(world, checkpoint: Path, seed: int, batches_n: int = 20) -> float:
    """ITM accuracy on in-domain batches of another seed, negatives from ``swap_images``."""
    from vlp.contract import batch_spec as K
    from vlp.platform.curation.itm_checkpoint import load_scoring_model
    from vlp.datasets.stream.data_config import DataConfig, SourceConfig
    from vlp.datasets.stream.data_plan import plan_data
    from vlp.datasets.stream.local_stream import local_batches
    from vlp.models import predict

    scoring = load_scoring_model(checkpoint, region_feat_dim=world.feature_dim,
                                 num_classes=world.num_classes)
    sources = tuple(SourceConfig(n, p) for n, p in in_domain_sources(world).items())
    plan = plan_data(DataConfig(sources=sources, batch_units=BATCH_UNITS, seed=seed + 1000,
                                itm_neg_prob=0.0), ["itm"])
    batches, rng = local_batches(plan, with_ids=True), np.random.default_rng(seed + 1000)
    right = total = 0
    try:
        for _ in range(batches_n):
            b = swap_images(batches.next("itm"), rng)
            pred = predict(scoring.model, b)["itm_score"] > 0.5
            right += int((pred == b[K.ITM_LABELS].bool()).sum())
            total += len(pred)
    finally:
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
    from vlp.platform.curation import curate_source

    total = {"tp": 0, "removed": 0, "truth": 0}
    for source in SOURCES:
        result = curate_source(world.root, source, out / setting, cfg, scorer=scorer,
                               filters=filters, overwrite=True, itm_info=itm_info)
        truth = truth_of(world, source, result.pairs)
        removed = result.removed_by != ""
        counts = {"tp": int((removed & truth).sum()), "removed": int(removed.sum()),
                  "truth": int(truth.sum())}
        _report(f"curation/{setting}/{source}", counts)
        scored = ~np.isnan(result.pairs.itm_score)
        if scorer is not None and scored.any():   # threshold-free: how well scores rank
            say(f"curation/{setting}/{source}/itm_auc",
                round(auc(-result.pairs.itm_score[scored], truth[scored]), 4))
        for k in total:
            total[k] += counts[k]
    _report(f"curation/{setting}/all", total)


def auc(score: np.ndarray, positive: np.ndarray) -> float:
    """P(score of a random positive > score of a random negative), ties counting half."""
    from scipy.stats import rankdata
    ranks = rankdata(score)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return float("nan")
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _report(prefix: str, c: dict) -> None:
    say(f"{prefix}/removed", c["removed"])
    say(f"{prefix}/precision", round(c["tp"] / c["removed"], 4) if c["removed"] else "nan")
    say(f"{prefix}/recall", round(c["tp"] / c["truth"], 4) if c["truth"] else "nan")


def main(argv=None) -> int:
    from dataclasses import replace

    from vlp.platform.curation import FILTERS, CurationConfig
    from vlp.platform.curation.itm_checkpoint import load_scoring_model
    from vlp.platform.curation.itm_scorer import ItmScorer
    from vlp.datasets.synth import generate_world
    from vlp.datasets.storage.world import WorldError, load_manifest

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
    for k in (2, 3):                          # the one rule this world's noise answers to
        measure(world, out, f"text_frequency@{k}", ["text_frequency"],
                replace(cfg, max_images_per_text=k))

    train = {"platform": train_platform, "local": train_local}[args.trainer]
    checkpoint = Path(args.checkpoint) if args.checkpoint else train(
        world, out / "model", args.train_steps, args.lr, args.seed)
    say("curation/itm_model/trainer", args.trainer if not args.checkpoint else "given")
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
