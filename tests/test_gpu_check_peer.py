"""The GPU check's peer ratio (vlp/platform/gpu_check/peer.py): vlp's model against the
official UNITER model on the same batches, alternated. Without a checkout the check says in
one line why it skips; ``make gpu-reference`` (run by ``make gpu-wheels``) carries the four
files it needs; with a real checkout the comparison runs on a CPU at the check's quick size.

The checkout: $UNITER_REPO, else the repository's ``.whl/uniter-reference`` (``make
gpu-wheels UNITER_REPO=<checkout>``); the tests that need one skip without it (the code is
MIT and not bundled: ``git clone https://github.com/ChenRocks/UNITER``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from vlp.contract import batch_spec as bs
from vlp.platform.gpu_check import peer
from vlp.platform.gpu_check.check import sizes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkout() -> Path:
    repo, why = peer.find_reference(None, ROOT)
    if repo is None:
        pytest.skip(why)
    return repo


def test_without_a_checkout_the_skip_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(peer.ENV, raising=False)
    repo, why = peer.find_reference(None, tmp_path)
    assert repo is None and "\n" not in why
    assert "make gpu-wheels UNITER_REPO=" in why and str(tmp_path / peer.CARRIED) in why
    (tmp_path / "model").mkdir()
    repo, why = peer.find_reference(str(tmp_path), tmp_path)
    assert repo is None and why.startswith(f"--uniter-repo {tmp_path}: no model/model.py")


def test_make_gpu_reference_carries_the_four_files(checkout, tmp_path, monkeypatch):
    wheels = tmp_path / ".whl"
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "gpu-reference",
                           f"UNITER_REPO={checkout}", f"WHEELS={wheels}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    carried = wheels / "uniter-reference"
    assert sorted(str(p.relative_to(carried)) for p in carried.rglob("*.py")) == \
        sorted(peer.FILES)
    assert (carried / "LICENSE").is_file()
    monkeypatch.delenv(peer.ENV, raising=False)
    assert peer.find_reference(None, tmp_path) == (carried, None)
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "gpu-reference",
                           "UNITER_REPO=", f"WHEELS={tmp_path / 'none'}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1
    assert "skip the peer ratio" in proc.stdout


def test_the_reference_gets_the_same_masked_targets(checkout):
    """The batches are the same: the reference's MLM loss covers vlp's masked tokens, its
    MRFR and MRC targets vlp's masked regions."""
    from vlp.testing.example_batches import example_batch

    ours, spec, ref = peer.build_pair(checkout, "uniter-tiny", 64, 21)
    ref.train()
    for task in ("mlm", "mrfr", "mrc-kl", "itm"):
        raw = {k: torch.as_tensor(v) for k, v in example_batch(
            spec, task, batch_size=4, text_len=12, num_regions=10, full_length=True,
            seed=1).items()}
        theirs = peer.reference_batch(raw, task, 12, 10)
        loss = ref(theirs, task=task)
        if task == "mlm":
            assert loss.numel() == int((raw[bs.MLM_LABELS] != -100).sum()) > 0
        elif task == "itm":
            assert loss[0].numel() == 4 and loss[1] is None   # no OT loss
        else:
            n = int(raw[bs.REGION_MASKED].sum())
            assert n > 0 and loss.shape[0] == n
        assert torch.isfinite(loss[0] if task == "itm" else loss).all()


def test_the_peer_ratio_on_a_cpu(checkout):
    q = sizes(True, False)
    assert sizes(False, True)["peer"]["batch"] * (28 + 36) == 10240   # UNITER's micro-batch
    from vlp.testing.example_batches import example_batch

    out = peer.peer_ratio(checkout, q["family"], torch.device("cpu"), example_batch,
                          autocast=None,
                          feat_dim=q["world"]["feature_dim"],
                          num_classes=q["world"]["num_classes"], **q["peer"])
    assert out["input_units"] == 8 * 22 and out["family"] == "uniter-tiny"
    for task in [*peer.MIX, "mix"]:
        row = out[task]
        assert row["vlp_s_per_input_unit"] > 0 and row["reference_s_per_input_unit"] > 0
        assert row["vlp_over_reference"] == pytest.approx(
            row["reference_s_per_input_unit"] / row["vlp_s_per_input_unit"])
    assert len(out["mlm"]["rounds_vlp"]) == len(out["mlm"]["rounds_reference"]) == 2
    assert out["vlp_over_reference"] == out["mix"]["vlp_over_reference"]
    if os.environ.get(peer.ENV) is None and (checkout / "COMMIT").is_file():
        assert out["reference_commit"] == (checkout / "COMMIT").read_text().strip()
