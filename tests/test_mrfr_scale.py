"""MRFR on the papers' scale (issue 39, item 3): UNITER §3.2 writes the regression loss as
Σᵢ ‖h_θ(v_m⁽ⁱ⁾) − r(v_m⁽ⁱ⁾)‖²₂ over the masked regions and ImageBERT §4.3 the same; vlp takes
the sum over the feature width per region and the mean over regions (sum-features, the
default of every family). The reference code's F.mse_loss (mean over regions × width, D times
smaller) stays selectable as mean-elements. Values worked by hand."""

from __future__ import annotations

import pytest
import torch

from vlp.models import FAMILIES, create_model
from vlp.platform.pretrain.experiment_config import ModelSection
from vlp.platform.pretrain.init_weights_check import model_kwargs
from vlp.tasks.mrfr import mrfr_loss


def test_mrfr_loss_by_hand():
    # two masked regions, D = 3: ‖(1,2,3) − 0‖² = 14, ‖0 − (1,1,1)‖² = 3
    h = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    r = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert float(mrfr_loss(h, r, "sum-features")) == pytest.approx((14 + 3) / 2)
    assert float(mrfr_loss(h, r, "mean-elements")) == pytest.approx((14 + 3) / 6)
    with pytest.raises(ValueError, match="mrfr_reduction='sum'"):
        mrfr_loss(h, r, "sum")


def test_every_region_family_defaults_to_the_papers_scale():
    for name in ("uniter-tiny", "uniter-base", "uniter-large", "imagebert-tiny",
                 "imagebert-base"):
        assert FAMILIES[name].mrfr_reduction == "sum-features", name
    model, _, _ = create_model("imagebert-tiny", ["mrfr"], region_feat_dim=16)
    assert model.heads["mrfr"].reduction == "sum-features"


def test_the_run_config_selects_the_reference_codes_normalisation():
    class Setup:     # what model_kwargs reads of a pretraining set-up
        family, tasks, feature_dim, num_classes, vocab_size = "uniter-tiny", ("mrfr",), 16, 5, 0
        preprocess = type("P", (), {"vocab_size": 0})

    kw = model_kwargs(ModelSection(family="uniter-tiny", mrfr_reduction="mean-elements"),
                      Setup)
    assert kw["overrides"]["mrfr_reduction"] == "mean-elements"
    model, _, _ = create_model(**kw)
    assert model.heads["mrfr"].reduction == "mean-elements"
    assert "mrfr_reduction" not in model_kwargs(ModelSection(family="uniter-tiny"),
                                                Setup)["overrides"]
    with pytest.raises(ValueError, match="mrfr_reduction='sum'"):
        create_model("uniter-tiny", ["mrfr"], region_feat_dim=16,
                     overrides={"mrfr_reduction": "sum"})
