"""Small details the reference code fixes and the papers leave open (issue 18, item 6):
WRA's transport plan covers [CLS] and [SEP]; NLVR2 pair-biattn fuses with ReLU."""

from __future__ import annotations

import torch

from vlp.contract import batch_spec as bs
from vlp.models import create_model
from vlp.models.heads import build_head
from vlp.testing.example_batches import example_batch
from vlp.tasks.wra import cosine_cost, ipot_plan

torch.set_num_threads(1)


def test_wra_transport_plan_includes_cls_and_sep():
    torch.manual_seed(0)
    model, spec, _ = create_model("uniter-tiny", tasks=["itm", "wra"])
    model.eval()
    batch = example_batch(spec, "wra", batch_size=4)
    with torch.no_grad():
        out = model(batch, task="wra")
        enc = model.backbone(batch, pool=True)
    text, regions = enc.text_mask, enc.region_mask
    cost = cosine_cost(enc.text_output().float(), enc.region_output().float())
    cost = cost.masked_fill(~(text.unsqueeze(2) & regions.unsqueeze(1)), 0.0)
    plan = ipot_plan(cost, text, regions)
    # every real text token, [CLS] (position 0) and [SEP] (the last) included, ships mass
    last = text.sum(1) - 1
    rows = torch.arange(text.shape[0])
    assert (plan[:, 0].sum(-1) > 0).all() and (plan[rows, last].sum(-1) > 0).all()
    distance = (cost * plan).sum((1, 2))
    torch.testing.assert_close(out["wra_ot_distance"], distance.mean())
    labels = batch[bs.ITM_LABELS].bool()
    ot = (distance[labels].sum() - distance[~labels].sum()) / len(labels)
    torch.testing.assert_close(out["wra_loss"], 0.1 * ot)


def test_nlvr2_pair_biattn_fuses_with_relu():
    head = build_head("nlvr2-pair-biattn", name="nlvr2", hidden=64, num_heads=4)
    assert [type(m).__name__ for m in head.fuse] == ["Linear", "ReLU", "Dropout"]
    assert [type(m).__name__ for m in head.pool.score] == ["Linear", "ReLU", "Dropout"]
