"""VL-BERT's sentence-image relationship prediction (sirp): registered like every task,
sigmoid CE on one [Related] logit of the pooled [CLS], negatives that swap the caption only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.stream.data_config import DataConfig, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.batching.itm_negatives import choose_donors
from vlp.datasets.stream.local_stream import local_batches
from vlp.datasets.batching.task_batch import EXAMPLE_IMAGE_KEY, EXAMPLE_TEXT_KEY
from vlp.models import FAMILIES, create_model
from vlp.testing.example_batches import example_batch

torch.set_num_threads(1)


def test_sirp_is_registered_for_the_vlbert_families_only():
    from vlp.tasks import get_task, task_label, task_names

    assert get_task("sirp").negatives_swap == "text"
    assert "sirp" in task_names() and task_label("sirp") == "SIRP"
    have = {name for name, fam in FAMILIES.items() if "sirp" in fam.tasks}
    assert have == {name for name in FAMILIES if name.startswith("vlbert")}
    with pytest.raises(ValueError, match="does not apply"):
        create_model("uniter-tiny", ["sirp"])


def test_sirp_loss_is_sigmoid_ce_on_the_pooled_cls():
    torch.manual_seed(0)
    model, spec, _ = create_model("vlbert-tiny", ["sirp"])
    model.eval()
    batch = example_batch(spec, "sirp", batch_size=6)
    head = model.heads["sirp"]
    assert (head.in_features, head.out_features) == (64, 1)
    with torch.no_grad():
        out = model(batch, task="sirp")
        logit = head(model.backbone(batch, pool=True).pooled_output).squeeze(-1)
    # sigmoid cross-entropy written out (not the library call tasks/sirp.py makes): a related
    # pair (label 1) pays -log σ(z), an unrelated one -log(1 - σ(z)), averaged over the batch
    y = batch[K.ITM_LABELS].double()
    assert 0 < y.sum() < len(y)                         # both kinds in the batch
    p = 1 / (1 + torch.exp(-logit.double()))
    want = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
    torch.testing.assert_close(out["sirp_loss"].double(), want)
    assert set(out) == {"loss", "sirp_loss", "sirp_acc"}


def test_text_only_donors_never_swap_the_image():
    rng = np.random.default_rng(0)
    keys = np.repeat(np.arange(8), 2)
    t, n = rng.integers(5, 9, 16), rng.integers(3, 6, 16)
    d = choose_donors(keys, t, n, 1.0, np.random.default_rng(1), text_only=True)
    assert d.negative.all() and not d.swap_image.any()
    assert (keys[d.donor] != keys).all()
    either = choose_donors(keys, t, n, 1.0, np.random.default_rng(1))
    assert either.swap_image.any()


def test_sirp_batches_pair_images_with_other_captions(tiny_world):
    _, spec, _ = create_model("vlbert-tiny", ["mlm", "sirp"], region_feat_dim=64,
                              num_classes=17)
    cfg = DataConfig.for_model(spec, (SourceConfig("coco", str(tiny_world / "images" / "coco")),),
                               batch_units=512, bucket_window=64)
    src = local_batches(plan_data(cfg, ["mlm", "sirp"], model=spec), with_ids=True)
    try:
        batches = [src.next("sirp") for _ in range(3)]
    finally:
        src.close()
    for b in batches:
        related = b[K.ITM_LABELS].bool()
        assert (b[EXAMPLE_IMAGE_KEY] == b[EXAMPLE_TEXT_KEY]).tolist() == related.tolist()
        assert K.IMAGE_FEAT in b
    labels = torch.cat([b[K.ITM_LABELS] for b in batches]).float()
    assert 0.25 < float(labels.mean()) < 0.75
