"""SOHO's pieces: the visual dictionary's moving average, straight-through gradient and
cross-rank statistics, MVM's one-index masking, the plain-torch ResNets, 2-D sine positions."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from vlp.models import create_model
from vlp.models.family_config import RESNET18, RESNET101, RESNET_TINY
from vlp.testing.example_batches import example_batch
from vlp.models.vision.position_2d import sine_position_2d
from vlp.models.vision.resnet import ResNet
from vlp.models.vision.visual_dictionary import VisualDictionary

torch.set_num_threads(1)

ENTRIES = [[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]]
FEATURES = [[1.0, 0.0], [-1.0, 0.5], [9.0, 1.0], [11.0, -1.0], [12.0, 0.0]]  # → 0, 0, 1, 1, 1


def _dictionary(momentum: float = 0.4) -> VisualDictionary:
    vd = VisualDictionary(size=3, dim=2, momentum=momentum, init="normal")  # entries set here
    vd.embedding.copy_(torch.tensor(ENTRIES))
    return vd


def test_moving_average_update_matches_the_formula():
    vd = _dictionary(momentum=0.4).train()
    feats = torch.tensor(FEATURES, requires_grad=True)
    out, idx = vd(feats[None])
    assert idx.tolist() == [[0, 0, 1, 1, 1]]
    # the forward value is the entry as it was before the update
    assert torch.equal(out.detach()[0], torch.tensor([ENTRIES[i] for i in (0, 0, 1, 1, 1)]))
    g = 0.4  # d ← γ d + (1 − γ) mean(assigned); entry 2 was not used and stays
    expected = torch.tensor([
        [g * 0 + (1 - g) * (1 - 1) / 2, g * 0 + (1 - g) * (0 + 0.5) / 2],
        [g * 10 + (1 - g) * (9 + 11 + 12) / 3, g * 0 + (1 - g) * (1 - 1 + 0) / 3],
        [0.0, 10.0]])
    torch.testing.assert_close(vd.embedding, expected)
    # straight-through: the gradient reaches the features unchanged
    out.sum().backward()
    assert torch.equal(feats.grad, torch.ones_like(feats))


def test_padding_cells_do_not_vote_and_eval_does_not_update():
    vd = _dictionary(momentum=0.5).train()
    valid = torch.tensor([[True, True, True, True, False]])  # the 12.0 feature is padding
    vd(torch.tensor(FEATURES)[None], valid)
    assert vd.embedding[1].tolist() == pytest.approx([0.5 * 10 + 0.5 * 10, 0.0])
    before = vd.embedding.clone()
    vd.eval()(torch.tensor(FEATURES)[None])
    assert torch.equal(vd.embedding, before)


def test_statistics_are_all_reduced_across_ranks(monkeypatch):
    """Rank 0 sees FEATURES[:2]; a simulated rank 1 contributes FEATURES[2:] through
    all_reduce: the update must equal one rank seeing everything (a real 2-process gloo run
    costs ~20 s of interpreter start-up on this machine; the collective itself is torch's)."""
    others = torch.tensor(FEATURES[2:])
    other_idx = torch.tensor([1, 1, 1])
    other_stats = {2: torch.zeros(3, 2).index_add_(0, other_idx, others),
                   1: torch.bincount(other_idx, minlength=3).float()}
    reduced = []

    def all_reduce(tensor, *args, **kwargs):
        tensor += other_stats[tensor.dim()]
        reduced.append(tensor.dim())

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    vd = _dictionary(momentum=0.4).train()
    vd(torch.tensor(FEATURES[:2])[None])
    assert sorted(reduced) == [1, 2]  # sums and counts both
    monkeypatch.undo()
    single = _dictionary(momentum=0.4).train()
    single(torch.tensor(FEATURES)[None])
    torch.testing.assert_close(vd.embedding, single.embedding)


def test_mvm_masks_every_cell_of_one_present_index():
    model, spec, _ = create_model("soho-tiny", tasks=["mvm"])
    embedder = model.backbone.visual
    indices = torch.tensor([[5, 5, 7, 9], [3, 3, 3, 8], [1, 2, 2, 2]])
    valid = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]).bool()
    apply = torch.tensor([True, True, False])
    for seed in range(5):
        torch.manual_seed(seed)
        masked = embedder.mask_one_index(indices, valid, apply)
        for row in range(2):
            chosen = indices[row][masked[row]].unique()
            assert len(chosen) == 1 and chosen.item() in indices[row][valid[row]].tolist()
            assert torch.equal(masked[row], (indices[row] == chosen) & valid[row])
        assert not masked[2].any()
    # the labels reach the encoder output for every text of a masked image
    batch = example_batch(spec, "mvm", batch_size=4)
    enc = model.backbone(batch, visual_masking=True)
    labels = enc.extras["mvm_labels"]
    assert labels.shape == enc.region_mask.shape and (labels != -100).any()


def test_dictionary_momentum_is_configurable():
    model, _, _ = create_model("soho-tiny", tasks=["mvm"],
                               overrides={"visual.dictionary_momentum": 0.9})
    assert model.backbone.visual.dictionary.momentum == 0.9


@pytest.mark.parametrize("cfg,params", [(RESNET18, 11_176_512), (RESNET101, 42_500_160)])
def test_resnet_trunks_have_torchvision_sizes(cfg, params):
    with torch.device("meta"):
        net = ResNet(cfg)
    # torchvision's resnet18 / resnet101 minus the 1000-way fc layer
    assert sum(p.numel() for p in net.parameters()) == params
    # torchvision's names: bottleneck stages start with a projection shortcut
    assert ("layer1.0.downsample.0.weight" in net.state_dict()) == (cfg.block == "bottleneck")


def test_resnet_output_stride_32():
    net = ResNet(RESNET_TINY)
    assert net(torch.randn(2, 3, 96, 128)).shape == (2, RESNET_TINY.out_channels, 3, 4)


def test_sine_positions_ignore_padding():
    padded = torch.ones(1, 3, 4, dtype=torch.bool)
    padded[..., 3] = False
    pos_padded = sine_position_2d(padded, 16)
    pos_small = sine_position_2d(torch.ones(1, 3, 3, dtype=torch.bool), 16)
    assert pos_padded.shape == (1, 3, 4, 16)
    torch.testing.assert_close(pos_padded[:, :, :3], pos_small)
