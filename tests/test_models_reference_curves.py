"""Stored reference loss curves: the first 50 steps of every task on every tiny family.

Each curve overfits one fixed example batch (seeded) with AdamW, dropout on, one CPU thread, a
2048-token vocabulary. The batch's content is random but its masking is the data pipeline's
(``vlp.testing.example_batches`` runs ``vlp.tasks.apply_masking``), so mlm and mlm-obj differ
in the words they mask (the example captions name objects). Two checks use it: every task's
loss falls (the head, the loss and the gradient path work), and the curve matches the stored
one within tolerance, so a change that alters training dynamics (init, a loss's
normalisation, the pipeline's masking, packing) shows up here.

Regenerate after an *intended* change, and say why in the commit:

    .venv/bin/python tests/test_models_reference_curves.py --write [FAMILY ...]

(naming families rewrites only their curves and keeps the others as stored).

Across CPUs. Measured on one machine under three kernel sets (native AVX-512; torch, oneDNN
and MKL held to AVX2: ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2``; and to the default/SSE4.1 kernels): every curve but SOHO's
stays within 2e-3 of the stored one at every step, and SOHO's mlm/itm/mlm-obj within 1% in
10-step means, so those are compared on any CPU. soho-tiny/mvm is not stable: its targets are
the visual dictionary's nearest entries, so a last-bit difference in the conv kernels changes
them from the first step (first loss 3.995 / 3.823 / 3.742 under the three sets, 10-step means
up to 19% apart, as on an AVX2-only AMD EPYC). It is kept per machine, with the machine
written beside it (``models_reference_curves_by_machine.json``: CPU model, torch's kernel
level, oneDNN's ISA cap, torch version), compared in 10-step means where the machine matches;
on another machine only what held across the three sets is checked (its 50-step mean within
25% of the stored curve's). Add this machine's entry with

    .venv/bin/python tests/test_models_reference_curves.py --write-machine
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import pytest
import torch

from vlp.models import FAMILIES, create_model
from vlp.testing.example_batches import example_batch

CURVES_FILE = Path(__file__).parent / "data" / "models_reference_curves.json"
TINY = ("uniter-tiny", "vlbert-tiny", "imagebert-tiny", "soho-tiny")
COMBOS = [(family, task) for family in TINY for task in FAMILIES[family].tasks]
STEPS, SEED, LR = 50, 0, 2e-3
FEAT_DIM, NUM_CLASSES = 64, 20  # synthetic-world sizes
VOCAB = 2048  # the 30522-row embedding table would dominate a tiny model's step time (5×)
RTOL, ATOL = 2e-3, 2e-4  # CPU float32, one thread: run-to-run identical; allow BLAS drift
# SOHO's curves go through the visual dictionary's argmin: a last-bit difference in the conv
# kernels (another CPU's SIMD width, another thread count) flips an assignment now and then
# and the per-step curve drifts (measured: 0.11 absolute on mvm with 2 threads instead of 1).
# Its 10-step window means stay within 1.1%, while a real change moves them 17–23% (dictionary
# momentum 0.4 → 0.6 on mvm; dropout off): compare those with 5%.
WINDOW, WINDOW_RTOL = 10, 5e-2
MACHINE_FILE = Path(__file__).parent / "data" / "models_reference_curves_by_machine.json"
KERNEL_SENSITIVE = ("soho-tiny/mvm",)
OTHER_MACHINE_RTOL = 0.25   # measured: 50-step means 12% apart across the three kernel sets


def machine() -> dict[str, str]:
    """What decides the kernels a curve ran through."""
    cpu = platform.processor()
    if Path("/proc/cpuinfo").exists():
        cpu = next((line.split(":", 1)[1].strip() for line in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    return {"cpu": cpu, "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "native"),
            "mkl_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS", "native"),
            "torch": torch.__version__}


def loss_curve(family: str, task: str, steps: int = STEPS) -> list[float]:
    torch.manual_seed(SEED)
    model, spec, _ = create_model(family, tasks=[task], region_feat_dim=FEAT_DIM,
                                  num_classes=NUM_CLASSES, vocab_size=VOCAB)
    batch = example_batch(spec, task, batch_size=4, text_len=12, num_regions=10, seed=SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    model.train()
    curve = []
    for _ in range(steps):
        out = model(batch, task=task)
        optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        optimizer.step()
        curve.append(float(out["loss"].detach()))
    return curve


@pytest.fixture(scope="module")
def curves():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield {f"{family}/{task}": loss_curve(family, task) for family, task in COMBOS}
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("family,task", COMBOS)
def test_loss_falls_when_overfitting_one_batch(curves, family, task):
    curve = curves[f"{family}/{task}"]
    first, last = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    assert last < 0.7 * first, (family, task, first, last)


def window_means(curve) -> torch.Tensor:
    return torch.tensor(curve).view(-1, WINDOW).mean(1)


def test_matches_stored_reference_curves(curves):
    stored = json.loads(CURVES_FILE.read_text())
    assert stored["steps"] == STEPS and sorted(stored["curves"]) == sorted(curves)
    for name, curve in curves.items():
        if name in KERNEL_SENSITIVE:
            continue            # test_kernel_sensitive_curves_match_this_machines
        ours, ref = torch.tensor(curve), torch.tensor(stored["curves"][name])
        if FAMILIES[name.split("/")[0]].visual.input_kind == "pixels":
            torch.testing.assert_close(window_means(curve), window_means(ref), rtol=WINDOW_RTOL,
                                       atol=ATOL, msg=lambda m: f"{name} (10-step means): {m}")
        else:
            torch.testing.assert_close(ours, ref, rtol=RTOL, atol=ATOL,
                                       msg=lambda m: f"{name}: {m}")


def test_kernel_sensitive_curves_match_this_machines(curves):
    here = machine()
    entries = json.loads(MACHINE_FILE.read_text())["machines"]
    mine = [e for e in entries if e["machine"] == here]
    stored = json.loads(CURVES_FILE.read_text())["curves"]
    for name in KERNEL_SENSITIVE:
        if mine:
            torch.testing.assert_close(
                window_means(curves[name]), window_means(mine[0]["curves"][name]),
                rtol=WINDOW_RTOL, atol=ATOL, msg=lambda m: f"{name} on {here}: {m}")
        else:       # another machine: only what held across kernel sets
            ours, ref = sum(curves[name]) / STEPS, sum(stored[name]) / STEPS
            assert abs(ours - ref) <= OTHER_MACHINE_RTOL * ref, (name, here, ours, ref)


def test_machine_entries_are_complete():
    entries = json.loads(MACHINE_FILE.read_text())["machines"]
    assert entries and all(set(e["curves"]) == set(KERNEL_SENSITIVE) for e in entries)
    keys = [json.dumps(e["machine"], sort_keys=True) for e in entries]
    assert len(set(keys)) == len(keys)
    assert all(set(e["machine"]) == set(machine()) for e in entries)


def test_no_two_stored_curves_are_the_same():
    """A stored curve identical to another checks nothing the other does not."""
    stored = json.loads(CURVES_FILE.read_text())["curves"]
    seen = {}
    for name, curve in stored.items():
        assert tuple(curve) not in seen, f"{name} repeats {seen[tuple(curve)]}"
        seen[tuple(curve)] = name


def write_reference_curves(families: tuple[str, ...] = TINY) -> None:
    unknown = sorted(set(families) - set(TINY))
    if unknown:
        sys.exit(f"unknown families {unknown}: expected some of {TINY}")
    torch.set_num_threads(1)
    started = time.time()
    data = {"steps": STEPS, "seed": SEED, "lr": LR, "feat_dim": FEAT_DIM,
            "num_classes": NUM_CLASSES, "vocab_size": VOCAB, "torch": torch.__version__,
            "curves": {}}
    kept = {} if set(families) == set(TINY) else json.loads(CURVES_FILE.read_text())["curves"]
    for f, t in COMBOS:   # the stored order
        name = f"{f}/{t}"
        data["curves"][name] = loss_curve(f, t) if f in families else kept[name]
    CURVES_FILE.parent.mkdir(parents=True, exist_ok=True)
    CURVES_FILE.write_text(json.dumps(data, indent=1) + "\n")
    for name, curve in data["curves"].items():
        print(f"{name:28s} {curve[0]:9.4f} → {curve[-1]:9.4f}")
    print(f"wrote {CURVES_FILE} in {time.time() - started:.1f}s")


def write_machine_curves() -> None:
    """Add (or replace) this machine's entry of the kernel-sensitive curves."""
    torch.set_num_threads(1)
    here = machine()
    data = json.loads(MACHINE_FILE.read_text()) if MACHINE_FILE.exists() else {"machines": []}
    curves = {name: loss_curve(*name.split("/")) for name in KERNEL_SENSITIVE}
    data["machines"] = [e for e in data["machines"] if e["machine"] != here]
    data["machines"].append({"machine": here, "curves": curves})
    MACHINE_FILE.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {here} into {MACHINE_FILE}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-machine"]:
        write_machine_curves()
    elif sys.argv[1:2] == ["--write"]:
        write_reference_curves(tuple(sys.argv[2:]) or TINY)
    else:
        sys.exit(f"usage: {sys.argv[0]} --write [FAMILY ...] | --write-machine")
