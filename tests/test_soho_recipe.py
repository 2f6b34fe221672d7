"""SOHO's dictionary recipe: entries initialised from data, the paper's conv → pool order, the
usage metrics, CNN weights from a torchvision checkpoint, and the optimiser recipe (SGD for
the CNN beside AdamW, the CNN frozen for the cold start)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from vlp.models import create_model
from vlp.models.family_config import RESNET_TINY, ResNetConfig
from vlp.testing.example_batches import example_batch
from vlp.models.vision.cnn_weights import cnn_weights_problem, load_cnn_weights
from vlp.models.vision.resnet import ResNet
from vlp.models.vision.visual_dictionary import VisualDictionary
from vlp.platform.training.cnn_recipe import CNN_MARKER, SgdAdamW, build_cnn_recipe
from vlp.platform.training.engine import WarmupLinearDecay

torch.set_num_threads(1)


def _soho(tasks=("mlm", "itm", "mvm"), **overrides):
    torch.manual_seed(0)
    return create_model("soho-tiny", tasks=list(tasks), overrides=overrides or None)


def _grid(model, batch):
    emb = model.backbone.visual
    grid, valid, _ = emb.encode_images(batch["pixels"], batch.get("pixel_mask"))
    return grid.detach(), valid


# ---- the visual dictionary -----------------------------------------------------------------

def test_entries_start_from_the_first_batch_at_the_features_scale():
    model, spec, _ = _soho()
    batch = example_batch(spec, "mvm", batch_size=8)
    vd = model.backbone.visual.dictionary
    assert not bool(vd.initialised)
    grid, valid = _grid(model, batch)
    model.train()(batch, task="mvm")
    assert bool(vd.initialised)
    feats = grid[valid]
    feat_norm, entry_norm = feats.norm(dim=-1).mean(), vd.embedding.norm(dim=-1).mean()
    assert 0.5 < float(entry_norm / feat_norm) < 2.0      # N(0, 1) entries: ~8 against ~21
    # entries spread over the features: most images map to several entries, not one or two
    per_image = [vd.assign(grid[i][valid[i]]).unique().numel() for i in range(grid.shape[0])]
    assert min(per_image) >= 4, per_image


def test_initialise_from_samples_features():
    vd = VisualDictionary(size=4, dim=3)
    feats = torch.arange(30.0).reshape(10, 3)
    vd.initialise_from(feats)
    rows = {tuple(r) for r in feats.tolist()}
    assert all(tuple(e) in rows for e in vd.embedding.tolist())
    assert len({tuple(e) for e in vd.embedding.tolist()}) == 4    # without replacement
    few = VisualDictionary(size=8, dim=3)
    few.initialise_from(feats[:2])                                # repeats, nudged apart
    assert len({tuple(e) for e in few.embedding.tolist()}) == 8
    assert (few.embedding - feats[:2].mean(0)).norm(dim=-1).max() < 10


def test_initialised_entries_survive_a_reload_and_old_checkpoints_count_as_trained():
    model, spec, _ = _soho()
    batch = example_batch(spec, "mvm", batch_size=4)
    model.train()(batch, task="mvm")
    state = copy.deepcopy(model.state_dict())
    fresh, _, _ = _soho()
    fresh.load_state_dict(state)
    vd = fresh.backbone.visual.dictionary
    before = vd.embedding.clone()
    vd.train()(torch.randn(1, 5, vd.dim))
    changed = (vd.embedding != before).any(-1).sum()
    assert 1 <= changed <= 5          # a moving average of the entries 5 cells chose, no re-init
    del state["backbone.visual.dictionary.initialised"]   # written before the flag existed
    old, _, _ = _soho()
    old.load_state_dict(state)
    assert bool(old.backbone.visual.dictionary.initialised)


def test_normal_init_is_kept_as_an_option():
    model, _, _ = _soho(**{"visual.dictionary_init": "normal"})
    assert bool(model.backbone.visual.dictionary.initialised)
    with pytest.raises(ValueError, match="dictionary_init='kmeans'"):
        _soho(**{"visual.dictionary_init": "kmeans"})


def test_conv_then_pool_as_in_the_paper():
    model, spec, _ = _soho()
    emb = model.backbone.visual.eval()
    with torch.no_grad():
        emb.proj.weight.normal_()          # signed weights: max and projection do not commute
        x = torch.randn(2, 3, 64, 96)
        trunk = emb.resnet(x)
        grid, _, (h, w) = emb.encode_images(x, None)
        paper = F.max_pool2d(emb.proj(trunk), 2, ceil_mode=True)
        swapped = emb.proj(F.max_pool2d(trunk, 2, ceil_mode=True))
    torch.testing.assert_close(grid, paper.flatten(2).transpose(1, 2))
    assert not torch.allclose(grid, swapped.flatten(2).transpose(1, 2))


def test_usage_is_reported_with_every_loss():
    model, spec, _ = _soho()
    emb = model.backbone.visual
    indices = torch.tensor([[0, 0, 1, 5], [2, 2, 2, 9]])
    valid = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool()
    u = emb.usage(indices, valid)
    assert u["vd_used"].item() == pytest.approx(4 / 64)            # 0, 1, 2, 9
    assert u["vd_indices_per_image"].item() == pytest.approx(2.0)  # {0, 1} and {2, 9}
    p = torch.tensor([2, 1, 3, 1]) / 7
    assert u["vd_perplexity"].item() == pytest.approx(float((-(p * p.log()).sum()).exp()))
    for task in ("mlm", "itm", "mvm"):
        out = model.train()(example_batch(spec, task), task=task)
        assert {"vd_used", "vd_perplexity", "vd_indices_per_image"} <= set(out), task
        assert not out["vd_used"].requires_grad


# ---- CNN weights from a torchvision checkpoint ---------------------------------------------

def _torchvision_file(tmp_path, cfg: ResNetConfig = RESNET_TINY, name="resnet.pth"):
    """A random ResNet saved as torchvision saves one: no BN counters, with the fc layer."""
    torch.manual_seed(1)
    state = {k: v for k, v in ResNet(cfg).state_dict().items()
             if not k.endswith("num_batches_tracked")}
    state["fc.weight"], state["fc.bias"] = torch.randn(1000, cfg.out_channels), torch.zeros(1000)
    path = tmp_path / name
    torch.save(state, path)
    return path, state


def test_cnn_weights_load_by_name(tmp_path):
    path, state = _torchvision_file(tmp_path)
    model, _, _ = _soho()
    trunk = model.backbone.visual.resnet
    assert load_cnn_weights(trunk, str(path)) == len(state) - 2     # fc is not the trunk's
    for k, v in trunk.state_dict().items():
        if k in state:
            assert torch.equal(v, state[k]), k


def test_cnn_weights_that_do_not_fit_are_one_line_errors(tmp_path):
    trunk = ResNet(RESNET_TINY)
    wide, _ = _torchvision_file(tmp_path, ResNetConfig("basic", (1, 1, 1, 1), 16), "wide.pth")
    msg = cnn_weights_problem(trunk, str(wide))
    assert msg.startswith("model.cnn_init: ") and "wrong shape" in msg and "\n" not in msg
    assert "conv1.weight (16, 3, 7, 7) (expected (8, 3, 7, 7))" in msg
    deep, _ = _torchvision_file(tmp_path, ResNetConfig("basic", (2, 1, 1, 1), 8), "deep.pth")
    assert "unexpected key(s)" in cnn_weights_problem(trunk, str(deep))
    _, state = _torchvision_file(tmp_path)
    del state["layer4.0.bn2.running_var"]
    torch.save(state, tmp_path / "partial.pth")
    msg = cnn_weights_problem(trunk, str(tmp_path / "partial.pth"))
    assert "1 missing key(s)" in msg and "layer4.0.bn2.running_var" in msg
    assert "no such file" in cnn_weights_problem(trunk, str(tmp_path / "absent.pth"))
    with pytest.raises(ValueError, match="wrong shape"):
        load_cnn_weights(trunk, str(wide))


# ---- the optimiser recipe ------------------------------------------------------------------

def _recipe(model, cold_start_steps=0, cnn="sgd", total=10):
    return build_cnn_recipe(model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            cnn_optimizer=cnn, cnn_lr=1e-2, cnn_weight_decay=5e-4,
                            cnn_momentum=0.9, cold_start_steps=cold_start_steps,
                            schedule=WarmupLinearDecay(0, total, decay=False))


def _split(model):
    cnn = {n: p for n, p in model.named_parameters() if CNN_MARKER in "." + n}
    rest = {n: p for n, p in model.named_parameters() if CNN_MARKER not in "." + n}
    return cnn, rest


def test_sgd_for_the_cnn_adamw_for_the_rest_match_torch():
    model, spec, _ = _soho()
    twin = copy.deepcopy(model)
    recipe = _recipe(model)
    assert [g["algo"] for g in recipe.optimizer.param_groups] == ["adamw", "adamw", "sgd"]
    cnn, rest = _split(twin)
    decay = [p for p in rest.values() if p.ndim >= 2]
    plain = [p for p in rest.values() if p.ndim < 2]
    sgd = torch.optim.SGD(list(cnn.values()), lr=1e-2, momentum=0.9, weight_decay=5e-4)
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                               {"params": plain, "weight_decay": 0.0}], lr=1e-3)
    for step in range(3):
        batch = example_batch(spec, "itm", seed=step)
        for m, opts in ((model, [recipe.optimizer]), (twin, [sgd, adamw])):
            torch.manual_seed(step)
            for o in opts:
                o.zero_grad()
            m.train()(batch, task="itm")["loss"].backward()
            for o in opts:
                o.step()
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)


def test_no_recipe_for_region_families_or_a_shared_unfrozen_adamw():
    uniter, _, _ = create_model("uniter-tiny", tasks=["mlm"])
    assert _recipe(uniter, cold_start_steps=5) is None
    assert _recipe(_soho()[0], cnn="adamw") is None
    groups = _recipe(_soho()[0], cnn="adamw", cold_start_steps=2).optimizer.param_groups
    assert [g["algo"] for g in groups] == ["adamw"] * 4


def test_cold_start_freezes_the_cnn_while_the_dictionary_and_transformer_train():
    model, spec, _ = _soho()
    recipe = _recipe(model, cold_start_steps=3)
    sched = recipe.scheduler(recipe.optimizer)
    cnn, rest = _split(model)
    emb = model.backbone.visual
    start_cnn = {n: p.detach().clone() for n, p in cnn.items()}
    start_rest = {n: p.detach().clone() for n, p in rest.items()}
    entries = []
    for step in range(1, 6):
        assert emb.cnn_frozen == (step <= 3), step
        recipe.optimizer.zero_grad()
        model.train()(example_batch(spec, "mvm", seed=step), task="mvm")["loss"].backward()
        frozen = step <= 3
        assert all((p.grad is None) == frozen for p in cnn.values()), step
        recipe.optimizer.step()
        sched.step()
        entries.append(emb.dictionary.embedding.clone())
        moved = [not torch.equal(p, start_cnn[n]) for n, p in cnn.items()]
        assert (not any(moved)) if frozen else all(moved), step
    assert all(not torch.equal(p, start_rest[n]) for n, p in rest.items()
               if p.grad is not None)
    assert not torch.equal(entries[0], entries[2])            # the dictionary kept moving
    # the freeze is scheduler state: a reloaded scheduler at step 2 re-freezes the CNN
    again = _recipe(model, cold_start_steps=3)
    resumed = again.scheduler(again.optimizer)
    emb.cnn_frozen = False
    resumed.load_state_dict({**sched.state_dict(), "last_epoch": 2})
    assert emb.cnn_frozen and "_set_frozen" not in sched.state_dict()


def test_sgd_adamw_rejects_unknown_algorithms():
    with pytest.raises(ValueError, match="algo 'adam'"):
        SgdAdamW([{"params": [torch.nn.Parameter(torch.zeros(2))], "algo": "adam"}])


def test_groups_at_lr_zero_keep_no_state():
    """ZeRO hands the frozen CNN zero gradients (not None): a group at lr 0 must not build
    momentum or moments from them."""
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = SgdAdamW([{"params": [a], "algo": "sgd", "lr": 0.0, "weight_decay": 0.1},
                    {"params": [b], "algo": "adamw", "lr": 0.0, "weight_decay": 0.1}])
    a.grad, b.grad = torch.ones(3), torch.ones(3)
    opt.step()
    assert not opt.state[a] and not opt.state[b]
    assert torch.equal(a, torch.ones(3)) and torch.equal(b, torch.ones(3))


# ---- config ---------------------------------------------------------------------------------

def test_config_checks_the_cold_start_and_the_cnn_checkpoint(tmp_path):
    from vlp.models import get_family
    from vlp.contract.config_loader import ConfigError
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.data import cnn_problems

    base = {"data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mvm": 1},
            "model": {"family": "soho-tiny"}, "train": {"steps": 100},
            "optimizer": {"warmup_steps": 10}}
    cfg = load_experiment_config(data=base)
    assert (cfg.optimizer.cnn, cfg.optimizer.cnn_lr, cfg.optimizer.cnn_weight_decay) == (
        "sgd", 1e-2, 5e-4)                                        # the paper's, by default
    with pytest.raises(ConfigError, match="model.cold_start_steps.*100 steps"):
        load_experiment_config(data=base, overrides=["model.cold_start_steps=100"])
    good, _ = _torchvision_file(tmp_path)
    wide, _ = _torchvision_file(tmp_path, ResNetConfig("basic", (1, 1, 1, 1), 16), "w.pth")
    soho = get_family("soho-tiny")
    ok = load_experiment_config(data=base, overrides=[f"model.cnn_init={good}",
                                                      "model.cold_start_steps=20"])
    assert cnn_problems(ok, soho) == []
    bad = load_experiment_config(data=base, overrides=[f"model.cnn_init={wide}"])
    [(key, msg)] = cnn_problems(bad, soho)
    assert key == "model.cnn_init" and "wrong shape" in msg and str(wide) in msg
    problems = cnn_problems(ok, get_family("uniter-tiny"))
    assert [k for k, _ in problems] == ["model.cnn_init", "model.cold_start_steps"]
    assert all("has no CNN" in m for _, m in problems)
