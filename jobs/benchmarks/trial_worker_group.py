"""A sweep trial's finetunes on a Ray Train run each against one kept worker group
(``vlp/platform/training/worker_group.py``), alternated in one run on one local Ray.

    python jobs/benchmarks/trial_worker_group.py --world runs/demo/world --steps 20

Each round runs the same finetunes (the demo's four benchmarks, ``--steps`` each, one seed)
both ways: ``ray_train`` (a Ray Train run per finetune: controller, worker process, process
group, DeepSpeed engine) and ``kept_group`` (one group started for the round, an engine per
finetune). Prints the seconds of each finetune and of each round both ways, their medians
and the ratio; the difference per finetune is what a worker group's start costs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

BENCHMARKS = ["refcoco+", "nlvr2", "vqa", "retrieval"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", required=True)
    p.add_argument("--steps", type=int, default=20, help="steps per finetune")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--benchmarks", nargs="+", default=BENCHMARKS)
    args = p.parse_args()

    from vlp.platform.cluster.ray_session import ensure_ray
    from vlp.platform.finetune import finetune_and_evaluate
    from vlp.platform.training.worker_group import WorkerGroup

    ensure_ray(2)
    overrides = [f"settings.{b}.steps={args.steps}" for b in args.benchmarks]
    overrides += ["settings.retrieval.options.eval_images=100", "train.log_every=1000"]
    rounds: dict[str, list[float]] = {"ray_train": [], "kept_group": []}
    per_finetune: dict[str, list[float]] = {"ray_train": [], "kept_group": []}
    with tempfile.TemporaryDirectory(prefix="vlp-bench-group-") as tmp:
        for r in range(args.rounds):
            for way in ("ray_train", "kept_group") if r % 2 == 0 else ("kept_group", "ray_train"):
                group = WorkerGroup() if way == "kept_group" else None
                start = time.perf_counter()
                for b in args.benchmarks:
                    t0 = time.perf_counter()
                    finetune_and_evaluate(None, [b], world=args.world, seed=r,
                                          run_name=f"{way}{r}", output_dir=f"{tmp}/{way}{r}",
                                          overrides=overrides, mlflow=False, group=group)
                    took = time.perf_counter() - t0
                    per_finetune[way].append(took)
                    print(f"round{r}.{way}.{b}_s {took:.1f}", flush=True)
                if group is not None:
                    group.close()
                rounds[way].append(time.perf_counter() - start)
                print(f"round{r}.{way}_s {rounds[way][-1]:.1f}", flush=True)
    for way in rounds:
        print(f"{way}.finetune_median_s {statistics.median(per_finetune[way]):.1f}")
        print(f"{way}.round_median_s {statistics.median(rounds[way]):.1f}")
    ratio = statistics.median(rounds["ray_train"]) / statistics.median(rounds["kept_group"])
    saved = (statistics.median(per_finetune["ray_train"])
             - statistics.median(per_finetune["kept_group"]))
    print(f"saved_per_finetune_s {saved:.1f}")
    print(f"ray_train_over_kept_group {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
