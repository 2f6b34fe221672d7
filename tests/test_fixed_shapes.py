"""``data.fixed_shapes``: region batches in a few shapes, so that a step is captured once per
shape. The losses and gradients of a padded batch are those of the same examples unpadded;
every tensor of a built batch has its width's shape; over 1,000 batches of real-shape rows a
task sees at most 12 shapes, at a stated padding cost."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.batching.fixed_shapes import ShapeSet, fit_widths, pad_to_shape
from vlp.datasets.stream.data_config import DataConfig, DataConfigError, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs" / "benchmarks"))

from bench_sources import write_bench_sources  # noqa: E402

FAMILY_TASKS = {
    "uniter-tiny": ["mlm", "itm", "mrfr", "mrc", "mrc-kl", "wra", "mlm-obj"],
    "imagebert-tiny": ["mlm", "itm", "moc", "mrfr"],
    "vlbert-tiny": ["mlm", "itm", "mrc-vlbert", "sirp"],
}
UNITER_MIX = {"mlm": 2, "itm": 2, "mrfr": 1, "mrc-kl": 1}


def world_sources(world, names=("coco", "vg", "cc", "sbu")):
    return tuple(SourceConfig(n, str(world / "images" / n)) for n in names)


def test_fitted_widths_pad_least():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 40, 300)
    widths = fit_widths(lengths, 4)
    assert len(widths) == 4 and widths[-1] == lengths.max()

    def waste(ws):
        ws = np.asarray(sorted(ws))
        return int((ws[np.searchsorted(ws, lengths)] - lengths).sum())

    values = np.unique(lengths)
    best = min(waste(list(c) + [values[-1]]) for c in itertools.combinations(values[:-1], 3))
    assert waste(widths) == best
    # a widest width above every length: the others are fitted below it (widening the
    # unconstrained fit's last width afterwards would pad its whole band to the widest)
    widest = int(lengths.max()) + 25
    ladder = fit_widths(lengths, 4, widest=widest)
    assert len(ladder) == 4 and ladder[-1] == widest
    best = min(waste(list(c) + [widest]) for c in itertools.combinations(values, 3))
    assert waste(ladder) == best < waste(widths[:-1] + [widest])


def padded(batch: dict, shapes: ShapeSet) -> dict:
    arrays = {k: v.numpy().copy() for k, v in batch.items()}
    pad_to_shape(arrays, shapes)
    return {k: torch.from_numpy(v) if v.ndim else torch.tensor(v.item())
            for k, v in arrays.items()}


def loss_and_grads(model, batch: dict, task: str) -> tuple[dict, dict]:
    model.zero_grad(set_to_none=True)
    out = model(dict(batch), task=task)
    out["loss"].backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    losses = {k: v.detach().clone() for k, v in out.items()
              if k.endswith("_loss") or k == "loss"}
    return losses, grads


@pytest.mark.parametrize("family", list(FAMILY_TASKS))
def test_padded_batch_has_the_losses_and_gradients_of_the_unpadded(tiny_world, family):
    """Every task of the tiny region families: the same examples and masking, batched as
    before and padded to a fixed shape with spare rows, columns and targets."""
    from vlp.models.factory import create_model

    tasks = FAMILY_TASKS[family]
    torch.manual_seed(0)
    model, spec, _ = create_model(family, tasks=tasks, region_feat_dim=64, num_classes=17)
    model.eval()   # no dropout: both forwards see the same network
    cfg = DataConfig.for_model(spec, world_sources(tiny_world), batch_units=512,
                               bucket_window=64)
    src = local_batches(plan_data(cfg, tasks, model=spec))
    try:
        for task in tasks:
            batch = src.next(task)
            rows, row = len(batch[K.POSITIVE]), int(batch[K.ROW_LENGTH])
            width = row + 5                        # padded columns and packed slots
            shapes = ShapeSet(budget=(rows + 3) * width, widths=(width, 4 * width),
                              text_cap=cfg.max_text_len + 2,
                              region_cap=cfg.regions.max_per_image(),
                              text_fit=batch[K.INPUT_IDS].shape[1],
                              region_fit=batch[K.REGION_MASK].shape[1], mask_prob=0.15)
            fixed = padded(batch, shapes)
            assert len(fixed[K.POSITIVE]) == rows + 3 and int(fixed[K.ROW_LENGTH]) == width
            for key in (K.MLM_TARGETS, K.REGION_TARGETS):
                if key in batch:   # spare targets too
                    assert fixed[key].shape[1] > batch[key].shape[1], (task, key)
            want, want_grads = loss_and_grads(model, batch, task)
            got, got_grads = loss_and_grads(model, fixed, task)
            assert want.keys() == got.keys()
            for k in want:
                torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6,
                                           msg=f"{family} {task} {k}")
            assert want_grads.keys() == got_grads.keys(), task
            for n in want_grads:
                torch.testing.assert_close(got_grads[n], want_grads[n], rtol=1e-4, atol=1e-6,
                                           msg=f"{family} {task} grad {n}")
    finally:
        src.close()


@pytest.fixture(scope="module")
def real_shapes(tmp_path_factory):
    """Real-shape shards (bench_sources.py: BUTD's 10–100 regions, COCO-length captions) with
    narrow features: the shapes are what matters here."""
    out = tmp_path_factory.mktemp("real-shapes")
    write_bench_sources(out, images=600, feature_dim=4, num_classes=3, per_shard=200)
    return out


def real_config(world: Path, **kw) -> DataConfig:
    return DataConfig(sources=tuple(SourceConfig(s, str(world / "images" / s))
                                    for s in ("coco", "vg")),
                      batch_units=10240, bucket_window=10240, **{"fixed_shapes": True, **kw})


def test_built_batches_have_their_widths_shapes(real_shapes):
    """UNITER's mix through the batcher: every tensor of a batch has the shape its task and
    width give (so counting widths counts shapes), padding rows and targets are flagged, and
    the shapes are part of the batcher's state."""
    from vlp.datasets.batching.task_sampler import TaskSampler

    cfg = real_config(real_shapes)
    plan = plan_data(cfg, UNITER_MIX)
    src = local_batches(plan)
    sampler = TaskSampler(UNITER_MIX)
    seen: dict[tuple, tuple] = {}
    try:
        for _ in range(24):
            task = sampler.next()
            batch = src.next(task)
            shapes = src.window.shapes
            width = int(batch[K.ROW_LENGTH])
            assert width in shapes.widths
            rows, t, n = shapes.rows(width), shapes.text_len(width), shapes.regions(width)
            assert batch[K.INPUT_IDS].shape == (rows, t)
            assert batch[K.REGION_FEATS].shape == (rows, n, plan.feature_dim)
            assert int(batch[K.ROW_VALID].sum()) == int(batch[K.NUM_EXAMPLES])
            assert int(batch[K.INPUT_UNITS]) == rows * width <= cfg.batch_units
            if K.MLM_TARGETS in batch:
                assert batch[K.MLM_TARGETS].shape == (2, shapes.text_targets(width))
            if K.REGION_TARGETS in batch:
                assert batch[K.REGION_TARGETS].shape == (2, shapes.region_targets(width))
            signature = tuple(sorted((k, tuple(v.shape)) for k, v in batch.items()))
            assert seen.setdefault((task, width), signature) == signature
        assert src.stats["shape_target_overflow"] == 0
        state = src.state_dict()
    finally:
        src.close()
    assert ShapeSet.from_state(state["shapes"]) == shapes
    again = local_batches(plan)
    again.load_state_dict(state)
    assert again.window.shapes == shapes   # a resumed run keeps its shapes, not refitted
    again.close()


def test_a_thousand_batches_take_few_shapes_at_a_small_padding_cost(real_shapes):
    """Over 1,000 batches of real-shape rows (the batcher's own window cuts them; lengths
    only, no collate), each task sees at most 12 shapes and at most 5% of the input units are
    padding in all (within rows and empty rows, today's batching's padding included): every
    batch is full (each width band's partly filled batch waits in the next window), and the
    padding is within half a point of the least that 12 widths can give these rows."""
    from vlp.datasets.batching.image_block import ImageBlock
    from vlp.datasets.batching.shape_census import width_census
    from vlp.datasets.batching.task_sampler import TaskSampler
    from vlp.datasets.stream.local_stream import local_blocks

    plan = plan_data(real_config(real_shapes), UNITER_MIX)
    blocks = [ImageBlock.from_table(t, plan.feature_dim, plan.num_classes, plan.loc_dim)
              for t in local_blocks(plan)(0)]
    census, shapes = width_census(plan, blocks, TaskSampler(UNITER_MIX), 1000)
    figures = census.figures()
    print(figures, shapes.widths)
    assert census.batches == 1000
    assert figures["most_shapes_per_task"] <= 12, figures
    assert figures["padding_share_empty_rows"] < 0.002, figures
    assert census.padding <= 0.05, figures            # measured: 4.9%
    assert census.padding <= census.floor(12) + 0.005, figures
    # today's batching of the same rows: one shape per longest row, less padding
    today, _ = width_census(plan_data(real_config(real_shapes, fixed_shapes=False),
                                      UNITER_MIX), blocks, TaskSampler(UNITER_MIX), 1000)
    assert today.figures()["most_shapes_per_task"] > 40
    assert today.padding < census.padding


def test_fixed_shapes_are_for_region_input(tiny_world):
    with pytest.raises(DataConfigError, match="fixed_shapes"):
        DataConfig(sources=world_sources(tiny_world), visual="pixels", fixed_shapes=True)
