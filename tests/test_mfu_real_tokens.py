"""MFU on real tokens beside the padded figure: the collate counts the unpadded input units,
the prefetcher hands them over on the host, the report window turns them into
``mfu_real``; and the peak table names the cluster's GPU types as CUDA names them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlp.contract import batch_spec as bs
from vlp.contract.batch_indices import add_model_indices
from vlp.models.flops import EncoderShape
from vlp.platform.training.checkpointing import TrainerState
from vlp.platform.training.device_peaks import peak_flops
from vlp.platform.training.prefetch import Prefetcher
from vlp.platform.training.step_stats import ReportWindow


def _region_batch():
    text_mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    region_mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    labels = np.full((3, 4), -100)
    labels[0, 1] = labels[1, 3] = labels[2, 1] = 7
    masked = np.zeros((3, 3), bool)
    masked[0, 0] = masked[1, 0] = masked[2, 2] = True
    return {bs.TEXT_MASK: text_mask, bs.REGION_MASK: region_mask, bs.MLM_LABELS: labels,
            bs.REGION_MASKED: masked, bs.POSITIVE: np.array([True, False, True]),
            bs.INPUT_UNITS: np.array(3 * 5), bs.NUM_EXAMPLES: np.array(3)}


def test_the_collate_counts_real_units_rows_and_loss_positions_on_the_host():
    batch = _region_batch()
    add_model_indices(batch)
    assert int(batch[bs.ROW_LENGTH]) == 5                  # rows of 5, 5, 5 tokens
    assert int(batch[bs.REAL_UNITS]) == 3 + 2 + 4 + 1 + 2 + 3   # 15: the padded count is 15 too
    batch[bs.TEXT_MASK][1, 3] = 0
    add_model_indices(batch)
    assert int(batch[bs.REAL_UNITS]) == 14 and int(batch[bs.ROW_LENGTH]) == 5
    # the negative pair (row 1) has no loss positions; row-major order
    assert batch[bs.MLM_TARGETS].tolist() == [[0, 2], [1, 1]]
    assert batch[bs.REGION_TARGETS].tolist() == [[0, 2], [0, 2]]


class _One:
    def __init__(self, batch):
        self.batch = batch

    def next(self, task=None):
        return self.batch

    def state_dict(self):
        return {}


def test_the_prefetcher_hands_real_units_and_the_row_length_over_as_host_integers():
    batch = _region_batch()
    add_model_indices(batch)
    host = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
    item = Prefetcher(_One("mlm"), _One(host), depth=0, device=torch.device("cpu")).next()
    assert item.real_units == 15 and item.input_units == 15
    assert isinstance(item.batch[bs.ROW_LENGTH], int)
    assert isinstance(item.batch[bs.REAL_UNITS], int)


def test_mfu_real_is_the_padded_mfu_scaled_by_the_real_work():
    shape = EncoderShape(linear_weights=1_000_000, hidden=64, layers=2)
    padded = shape.train_flops(10, 1000)
    real = shape.train_flops(10, 600)
    assert 0.5 < real / padded < 0.6       # the linear part scales with units, attention with units²
    window = ReportWindow(peak=1e12, world=1)
    window.add({"global_batch_examples": 10, "global_batch_input_units": 1000,
                "model_flops": padded, "model_flops_real": real, "loss": 1.0})
    out = window.summary(TrainerState(step=1))
    assert out["mfu_real"] == pytest.approx(out["mfu"] * real / padded)
    assert out["model_tflops_per_s_real"] < out["model_tflops_per_s"]


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA L4", "NVIDIA A100-SXM4-40GB",
                                  "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3",
                                  "NVIDIA H200"])
def test_every_cluster_gpu_type_has_a_peak(name):
    bf16 = peak_flops(name, "bf16")
    assert bf16 and bf16 > 5e13
    assert peak_flops(name, "fp16") == bf16
    assert peak_flops(name, "fp32") == bf16 / 2      # TF32 tensor cores
    assert peak_flops(name, "bf16", configured_tflops=100.0) == 1e14
    assert peak_flops("cpu", "bf16") is None
