"""Issue 29: each family's pretraining objective as its paper (and VL-BERT's reference code)
runs it. VL-BERT: one forward per example with words and RoIs masked together, the losses
summed (its family default; ``train.objective: sampled`` goes back to one task per batch);
its text tokens see the same whole-image feature whether or not a RoI is masked. ImageBERT:
MOC and MRFR on one masked region set under ``summed`` (``train.forward_groups: []`` gives
each its own)."""

from __future__ import annotations

import pytest
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.batching.task_sampler import SummedTasks
from vlp.models.families import get_family
from vlp.platform.training import objective

from test_summed_objective import experiment, summed_source

VLBERT_MIX = {"mlm": 1.0, "mrc-vlbert": 1.0, "sirp": 1.0}


def test_vlbert_defaults_to_one_summed_forward_with_words_and_rois_masked_together(tiny_world):
    from vlp.platform.pretrain.run import loop_config

    train = loop_config(experiment("vlbert-tiny")).train
    assert train.objective == "summed"
    assert train.forward_groups == get_family("vlbert-tiny").forward_groups
    model, src = summed_source(tiny_world, "vlbert-tiny", VLBERT_MIX)
    draw = SummedTasks(VLBERT_MIX, groups=train.forward_groups).next()
    batch = src.next(draw)
    src.close()
    assert list(batch[K.TASK_BATCHES]) == ["mlm"]            # one batch for the three tasks
    one = batch[K.TASK_BATCHES]["mlm"]
    words = (one[K.MLM_LABELS] != -100).any(1)
    rois = one[K.REGION_MASKED].bool().any(1)
    assert bool((words & rois).any()), "no example has both masked words and masked RoIs"
    assert K.ITM_LABELS in one
    calls = []
    model.eval()
    hook = model.backbone.register_forward_hook(lambda *a: calls.append(1))
    out = objective.forward(model, batch, draw)
    hook.remove()
    assert len(calls) == 1                                    # one forward per example
    total = sum(out[f"{t}_loss"] for t in VLBERT_MIX)         # weights 1 each
    assert torch.allclose(out["loss"], total)


def test_vlbert_goes_back_to_sampled_when_asked():
    from vlp.platform.pretrain.run import loop_config

    assert loop_config(experiment("vlbert-tiny", "train.objective=sampled")).train.objective \
        == "sampled"


def test_vlbert_text_tokens_see_the_same_whole_image_feature_with_and_without_a_masked_roi(
        tiny_world):
    mix = {"mlm": 1.0, "mrc-vlbert": 1.0}
    _, src = summed_source(tiny_world, "vlbert-tiny", mix)
    batch = src.next(SummedTasks(mix).next())[K.TASK_BATCHES]   # one example set, two batches
    src.close()
    words, rois = batch["mlm"], batch["mrc-vlbert"]
    assert torch.equal(words[K.INPUT_IDS] != 0, rois[K.INPUT_IDS] != 0)   # the same examples
    assert rois[K.REGION_ZEROED].bool().any() and K.REGION_ZEROED not in words
    assert torch.equal(words[K.IMAGE_FEAT], rois[K.IMAGE_FEAT])


def test_imagebert_moc_and_mrfr_share_one_masked_region_set_under_summed(tiny_world):
    mix = {"mlm": 1.0, "moc": 1.0, "mrfr": 1.0, "itm": 1.0}
    groups = get_family("imagebert-tiny").forward_groups
    _, src = summed_source(tiny_world, "imagebert-tiny", mix)
    batch = src.next(SummedTasks(mix, groups=groups).next())["task_batches"]
    src.close()
    assert "mrfr" not in batch                         # MOC's batch serves both
    moc = batch["moc"]
    masked = moc[K.REGION_MASKED].bool()
    assert masked.any()
    assert torch.equal(moc[K.REGION_CLASS_LABELS] != -100, masked)   # MOC's targets
    assert K.REGION_FEAT_TARGETS in moc                               # MRFR's, same rows
    # MOC's policy drew the set: some masked regions keep their feature (10%)
    kept = masked & ~moc[K.REGION_ZEROED].bool()
    assert kept.any() or masked.sum() < 20
    # selectable: forward_groups [] gives each task its own masked set again
    _, src = summed_source(tiny_world, "imagebert-tiny", mix)
    apart = src.next(SummedTasks(mix).next())["task_batches"]
    src.close()
    assert not torch.equal(apart["moc"][K.REGION_MASKED], apart["mrfr"][K.REGION_MASKED])


def test_a_misspelt_forward_group_task_is_named():
    from vlp.contract.config_loader import ConfigError

    with pytest.raises(ConfigError, match=r"train.forward_groups.0.mrf"):
        experiment("imagebert-tiny", "train.forward_groups=[[moc, mrf]]")
