"""Joint masking reaches the model's input for every family with a visual masking task: in an
MLM batch of ``masking: joint`` SOHO masks one dictionary index per image (the embedder does
it, so the pipeline's flag alone is not enough) and the region families see zeroed regions."""

from __future__ import annotations

import pytest
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.stream.data_config import DataConfig, PixelConfig, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches
from vlp.models.embeddings.soho import MVM_LABELS


def _first_batch(world, family: str, task: str, masking: str):
    from vlp.models.factory import create_model

    model, spec, _ = create_model(family, tasks=[task], region_feat_dim=64, num_classes=17)
    sources = tuple(SourceConfig(n, str(world / "images" / n)) for n in ("coco", "vg"))
    extra = {}
    if spec.input_kind == "pixels":
        extra["pixels"] = PixelConfig(shorter_side=64, longer_max=64)
    cfg = DataConfig.for_model(spec, sources, batch_units=400, bucket_window=64,
                               masking=masking, **extra)
    src = local_batches(plan_data(cfg, [task], model=spec))
    try:
        return model.eval(), src.next(task)
    finally:
        src.close()


def _visual_input(model, batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The embedder's visual tokens and MVM labels as ``model(batch, 'mlm')`` sees them."""
    seen = {}

    def keep(module, args, kwargs, out):
        seen["visual"], seen["labels"] = out.visual, out.extras.get(MVM_LABELS)

    hook = model.backbone.visual.register_forward_hook(keep, with_kwargs=True)
    try:
        torch.manual_seed(0)
        with torch.no_grad():
            model(batch, task="mlm")
    finally:
        hook.remove()
    return seen["visual"], seen["labels"]


def test_soho_mlm_batch_in_joint_mode_masks_grid_cells(tiny_world):
    model, batch = _first_batch(tiny_world, "soho-tiny", "mlm", "joint")
    assert batch[K.MVM_APPLY].any()
    masked_input, labels = _visual_input(model, batch)
    plain = dict(batch)
    plain[K.MVM_APPLY] = torch.zeros_like(batch[K.MVM_APPLY])
    clear_input, _ = _visual_input(model, plain)
    assert labels is not None
    cells = labels != -100                               # [B, n]: the masked grid cells
    differs = (masked_input != clear_input).any(-1)
    assert cells.any()
    assert torch.equal(differs, cells)                   # exactly the masked cells change
    # every text of a flagged image sees one whole index masked (the image is encoded once
    # for all its texts); every positive text, whose words MLM masks, is among them
    flagged = batch[K.MVM_APPLY].bool()[batch[K.IMAGE_INDEX].long()]
    assert torch.equal(cells.any(1), flagged)
    assert flagged[batch[K.POSITIVE].bool()].all()
    for row in cells.any(1).nonzero()[:, 0]:
        assert labels[row][cells[row]].unique().numel() == 1


def test_soho_mlm_batch_in_conditional_mode_keeps_the_image(tiny_world):
    model, batch = _first_batch(tiny_world, "soho-tiny", "mlm", "conditional")
    assert K.MVM_APPLY not in batch
    _, labels = _visual_input(model, batch)
    assert labels is None


@pytest.mark.parametrize("family", ["uniter-tiny", "imagebert-tiny"])
def test_region_mlm_batch_in_joint_mode_zeroes_regions(tiny_world, family):
    _, batch = _first_batch(tiny_world, family, "mlm", "joint")
    zeroed = batch[K.REGION_ZEROED].bool()
    assert zeroed.any() and (batch[K.MLM_LABELS] != -100).any()
    assert (batch[K.REGION_FEATS][zeroed] == 0).all()
    real = batch[K.REGION_MASK].bool() & ~zeroed
    assert (batch[K.REGION_FEATS][real].abs().sum(-1) > 0).all()
