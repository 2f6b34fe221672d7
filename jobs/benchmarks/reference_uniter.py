"""vlp's uniter-base against the official UNITER code, forward+backward on the same batches.

    git clone https://github.com/ChenRocks/UNITER /tmp/UNITER        # not bundled: MIT code
    python jobs/benchmarks/reference_uniter.py --uniter-repo /tmp/UNITER --threads 2

The GPU check runs the same comparison on the GPU, bf16, with an optimizer step
(``vlp/platform/gpu_check/peer.py``, which this script shares its import and batches with).
The reference is imported from the checkout (its ``model`` package: ``UniterForPretraining``
at BERT-base size, vocabulary 30,522, D = 2048, C = 1601). Its apex ``FusedLayerNorm`` is
replaced by ``torch.nn.LayerNorm`` (apex needs a CUDA build); nothing else is changed.

Batches: ``model_throughput.py``'s standard batch (32 pairs × 20 tokens × 36 regions, every
sequence full length), built by vlp's pipeline masking; the reference gets the same tensors
in its own keys (``txt_labels`` -1 where vlp has -100, ``img_masks`` / ``img_mask_tgt`` from
vlp's masked regions, the masked rows' feature and soft-label targets; ITM without the
optional OT loss, as UNITER's pretraining config runs it by default). Losses are means.

Per task, one warm-up step of each model, then ``--rounds`` rounds in which the two models
alternate (the order flips every round); the median step of each. Prints a settings block,
then one figure per line: ``<task>/reference_s``, ``<task>/vlp_s``,
``<task>/vlp_over_reference`` (throughput ratio, > 1 = vlp faster) and the fraction of the
encoder-shape matmul roofline each reaches (``model_throughput.py``'s definitions), and the
same for the 2:2:1:1 mix.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_throughput import MIX, encoder_gemm_roofline, gemm_roofline, train_flops  # noqa: E402

from vlp.platform.gpu_check.peer import FILES, build_pair, reference_batch  # noqa: E402
from vlp.testing.example_batches import example_batch  # noqa: E402

TASKS = list(MIX)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--uniter-repo", type=Path, required=True,
                   help="a checkout of https://github.com/ChenRocks/UNITER")
    p.add_argument("--rounds", type=int, default=3, help="measured steps per task and model")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--text-len", type=int, default=20)
    p.add_argument("--regions", type=int, default=36)
    args = p.parse_args()
    if not all((args.uniter_repo / f).is_file() for f in FILES):
        raise SystemExit(f"--uniter-repo {args.uniter_repo}: no {FILES[2]} there; expected a "
                         "checkout of https://github.com/ChenRocks/UNITER")
    if args.threads:
        torch.set_num_threads(args.threads)
    # the same pair the GPU check times: vlp's uniter-base and the reference at its size
    ours, spec, ref = build_pair(args.uniter_repo, "uniter-base", 2048, 1601)
    ours.train()
    ref.train()
    batches = {t: {k: torch.as_tensor(v) for k, v in example_batch(
        spec, t, batch_size=args.batch, text_len=args.text_len, num_regions=args.regions,
        full_length=True).items()} for t in TASKS}
    ref_batches = {t: reference_batch(batches[t], t, args.text_len, args.regions)
                   for t in TASKS}

    def ours_step(task):
        ours(batches[task], task=task)["loss"].backward()
        ours.zero_grad(set_to_none=True)

    def ref_step(task):
        loss = ref(ref_batches[task], task=task)
        (loss[0] if task == "itm" else loss).mean().backward()
        ref.zero_grad(set_to_none=True)

    units = args.batch * (args.text_len + args.regions)
    flops = train_flops(ours, args.batch, args.text_len + args.regions)
    device = torch.device("cpu")
    print(f"# reference_uniter: official UNITER ({args.uniter_repo}, apex LayerNorm -> torch) "
          f"vs vlp uniter-base; batch {args.batch} × ({args.text_len} + {args.regions}) = "
          f"{units} input units; fp32 forward+backward, no optimiser step")
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.1f}; {args.rounds} alternated rounds per task after a warm-up")
    roofline = gemm_roofline(device)
    shaped = encoder_gemm_roofline(device, ours, units)
    print(f"fp32_gemm_2048_gflops {roofline / 1e9:.1f}")
    print(f"fp32_gemm_encoder_shapes_gflops {shaped / 1e9:.1f}")

    medians = {}
    for task in TASKS:
        ref_step(task)
        ours_step(task)
        times = {"reference": [], "vlp": []}
        for r in range(args.rounds):
            order = [("reference", ref_step), ("vlp", ours_step)]
            for name, step in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                step(task)
                times[name].append(time.perf_counter() - t0)
        medians[task] = {k: statistics.median(v) for k, v in times.items()}
        report(task, medians[task], flops, roofline, shaped)
    mix = {k: sum(MIX[t] * medians[t][k] for t in TASKS) / sum(MIX.values())
           for k in ("reference", "vlp")}
    report("mix_itm2_mlm2_mrfr1_mrckl1", mix, flops, roofline, shaped)
    return 0


def report(name: str, step: dict, flops: float, roofline: float, shaped: float) -> None:
    for who in ("reference", "vlp"):
        print(f"{name}/{who}_s {step[who]:.3f}")
    print(f"{name}/vlp_over_reference {step['reference'] / step['vlp']:.3f}")
    for who in ("reference", "vlp"):
        print(f"{name}/{who}_encoder_gemm_frac {flops / step[who] / shaped:.3f}")
        print(f"{name}/{who}_roofline_frac {flops / step[who] / roofline:.3f}")


if __name__ == "__main__":
    sys.exit(main())
