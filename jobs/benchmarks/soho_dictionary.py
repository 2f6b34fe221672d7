"""SOHO's visual dictionary with and without the paper's recipe, on a synthetic world.

    python jobs/benchmarks/soho_dictionary.py --world worlds/demo [--steps 300]

Two soho-tiny pretraining runs (MLM + ITM + MVM under the family's objective, SOHO's summed
Eq. 9 unless ``--objective sampled``; the same seed and data order), each a plain
single-process loop over the pipeline's local stream, through the platform's objective:

- recipe: dictionary entries initialised from the first batch's features, SGD for the CNN
  beside AdamW for the rest, the CNN frozen for the first ``--cold-start`` steps (the paper's
  10 of 40 epochs: a quarter of the run by default);
- without: entries drawn N(0, 1), one AdamW for everything, no cold start (vlp before the
  recipe). Both use the paper's conv → pool order.

At steps 0, N/2 and N it prints, on a fixed probe set of images outside the training order,
the share of the dictionary's entries that some probe cell maps to and the mean number of
distinct indices per image (MVM masks one index per image: with one or two indices it is
trivial). Step 0 is after the recipe's data initialisation (what its first training forward
does first). The target for the recipe at step N: at least 50% of the entries used and at
least 4 distinct indices per image.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch


SOURCES = ("coco", "vg")          # SOHO pretrains on the in-domain sets
TASKS = {"mlm": 1.0, "itm": 1.0, "mvm": 1.0}
TARGET_USED, TARGET_PER_IMAGE = 0.5, 4.0


def probe_images(plan, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` images (pixels [3, H, W], mask [H, W]) from a stream of another seed."""
    from vlp.datasets.stream.data_plan import plan_data
    from vlp.datasets.stream.local_stream import local_batches

    other = plan_data(plan.config.model_copy(update=dict(seed=plan.config.seed + 7919)),
                      list(TASKS))
    src, out = local_batches(other), []
    try:
        while len(out) < count:
            b = src.next("mvm")
            out += [(p, m) for p, m in zip(b["pixels"], b["pixel_mask"])]
    finally:
        src.close()
    return out[:count]


@torch.no_grad()
def usage(model, images) -> tuple[float, float, float]:
    """(share of entries used, distinct indices per image, perplexity) on the probe images."""
    emb = model.backbone.visual
    was = emb.training
    emb.eval()
    k = emb.dictionary.size
    counts, per_image = torch.zeros(k), []
    for pixels, mask in images:
        grid, valid, _ = emb.encode_images(pixels[None], mask[None])
        idx = emb.dictionary.assign(grid[0][valid[0]])
        counts += torch.bincount(idx, minlength=k).float()
        per_image.append(idx.unique().numel())
    emb.train(was)
    p = counts / counts.sum()
    perplexity = float((-(p[p > 0] * p[p > 0].log()).sum()).exp())
    return float((counts > 0).float().mean()), sum(per_image) / len(per_image), perplexity


def run_arm(recipe: bool, args, plan, images, say) -> dict[int, tuple[float, float, float]]:
    from vlp.datasets.stream.local_stream import local_batches
    from vlp.contract.batch_spec import TASK_BATCHES
    from vlp.datasets.batching.task_sampler import SummedTasks, TaskSampler
    from vlp.platform.training import objective as objectives
    from vlp.models import create_model
    from vlp.platform.training.cnn_recipe import build_cnn_recipe
    from vlp.platform.training.engine import WarmupLinearDecay, param_groups

    torch.manual_seed(args.seed)
    model, _, _ = create_model(
        "soho-tiny", list(TASKS),
        overrides={"visual.dictionary_init": "data" if recipe else "normal",
                   "visual.image_min_side": args.image_side,
                   "visual.image_max_side": args.image_side})
    schedule = WarmupLinearDecay(max(1, args.steps // 10), args.steps)
    betas, eps, wd = (0.9, 0.999), 1e-8, 0.01      # SOHO's AdamW (weight decay 1e-2)
    if recipe:
        r = build_cnn_recipe(model, lr=args.lr, betas=betas, eps=eps, weight_decay=wd,
                             cnn_optimizer="sgd", cnn_lr=args.cnn_lr, cnn_weight_decay=5e-4,
                             cnn_momentum=0.9, cold_start_steps=args.cold_start,
                             schedule=schedule)
        opt, sched = r.optimizer, r.scheduler(r.optimizer)
    else:
        opt = torch.optim.AdamW(param_groups(model, wd), lr=args.lr, betas=betas, eps=eps)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    batches = local_batches(plan)
    sampler = (SummedTasks(TASKS, args.seed, known=list(TASKS)) if args.objective == "summed"
               else TaskSampler(TASKS, args.seed))
    marks = {0, args.steps // 2, args.steps}
    out, start = {}, time.perf_counter()
    model.train()
    try:
        for step in range(args.steps + 1):
            task = sampler.next()
            batch = batches.next(task)
            if step == 0:   # what the first training forward does before anything else
                vd = model.backbone.visual.dictionary
                first = batch if isinstance(task, str) else batch[TASK_BATCHES][task[0]]
                if not bool(vd.initialised):
                    with torch.no_grad():
                        grid, valid, _ = model.backbone.visual.encode_images(
                            first["pixels"], first.get("pixel_mask"))
                    vd.initialise_from(grid[valid])
            if step in marks:
                out[step] = usage(model, images)
                say(f"  {'recipe' if recipe else 'without'} step {step}: entries used "
                    f"{out[step][0]:.1%}, indices per image {out[step][1]:.2f}, perplexity "
                    f"{out[step][2]:.1f} ({time.perf_counter() - start:.0f} s)")
            if step == args.steps:
                break
            loss = objectives.forward(model, batch, task)["loss"]
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            sched.step()
    finally:
        batches.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", required=True, help="a synthetic world folder (vlp data synth)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--cold-start", type=int, default=-1,
                    help="CNN frozen this many steps in the recipe arm (default: steps / 4)")
    ap.add_argument("--lr", type=float, default=5e-4, help="AdamW lr (Transformer, heads)")
    ap.add_argument("--cnn-lr", type=float, default=1e-2, help="SGD lr of the CNN (paper)")
    ap.add_argument("--batch-units", type=int, default=4096)
    ap.add_argument("--image-side", type=int, default=256,
                    help="images resized to this side: (side / 64)^2 grid cells each")
    ap.add_argument("--probe-images", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--objective", choices=["summed", "sampled"], default="",
                    help="default: the family's (soho-tiny: summed, SOHO's Eq. 9)")
    ap.add_argument("--arms", default="recipe,without",
                    help="which runs (one process per arm can run them side by side)")
    args = ap.parse_args(argv)
    arm_names = [a for a in args.arms.split(",") if a]
    if not arm_names or set(arm_names) - {"recipe", "without"}:
        print(f"--arms {args.arms!r}: expected recipe, without or both, comma-separated")
        return 2
    if args.cold_start < 0:
        args.cold_start = args.steps // 4
    torch.set_num_threads(max(1, torch.get_num_threads()))

    from vlp.datasets.stream.data_config import DataConfig, SourceConfig
    from vlp.datasets.stream.data_plan import plan_data
    from vlp.models import create_model, get_family

    args.objective = args.objective or get_family("soho-tiny").objective

    world = Path(args.world)
    if not (world / "images").is_dir():
        print(f"--world {world}: no images/ folder (generate one with `vlp data synth`)")
        return 2
    spec = create_model("soho-tiny", ["mvm"], overrides={
        "visual.image_min_side": args.image_side,
        "visual.image_max_side": args.image_side}).preprocess
    sources = tuple(SourceConfig(s, str(world / "images" / s)) for s in SOURCES)
    plan = plan_data(DataConfig.for_model(spec, sources, batch_units=args.batch_units,
                                          seed=args.seed), list(TASKS), model=spec)
    images = probe_images(plan, args.probe_images)
    print(f"soho-tiny on {world}: {args.steps} steps of {', '.join(TASKS)} (objective "
          f"{args.objective}), {args.batch_units} input units per batch, images "
          f"{args.image_side} px, "
          f"dictionary of {get_family('soho-tiny').visual.dictionary_size} entries; probe: "
          f"{len(images)} images; recipe: cold start "
          f"{args.cold_start} steps, SGD lr {args.cnn_lr} for the CNN, AdamW lr {args.lr}",
          flush=True)
    arms = {name: run_arm(name == "recipe", args, plan, images, lambda s: print(s, flush=True))
            for name in arm_names}
    print(f"{'step':>6} | " + " | ".join(f"{name + ': used':>13} {'idx/img':>8} {'ppl':>6}"
                                          for name in arms))
    for step in sorted(arms[arm_names[0]]):
        print(f"{step:>6} | " + " | ".join(
            f"{a[step][0]:>13.1%} {a[step][1]:>8.2f} {a[step][2]:>6.1f}" for a in arms.values()))
    end = {name: a[args.steps] for name, a in arms.items()}
    if "without" in end:
        print(f"without the recipe at step {args.steps}: entries used {end['without'][0]:.1%}, "
              f"indices per image {end['without'][1]:.2f}")
    if "recipe" not in end:
        return 0
    used, per_image = end["recipe"][:2]
    ok = used >= TARGET_USED and per_image >= TARGET_PER_IMAGE
    print(f"target at step {args.steps} with the recipe: entries used {used:.1%} (>= "
          f"{TARGET_USED:.0%}), indices per image {per_image:.2f} (>= {TARGET_PER_IMAGE:g}): "
          f"{'met' if ok else 'NOT met'}")
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
