"""SOHO finetunes on the VD module's input features (§4.2: "using input features of the VD
module for visual representation is better than directly applying VD embedding. We adopt the
former"), the quantised tokens a switch (``model.visual_tokens: dictionary``); the visual
dictionary stays as pre-training left it unless ``model.dictionary_updates`` asks."""

from __future__ import annotations

import pytest
import torch

from vlp.contract import batch_spec as K
from vlp.contract.config_loader import ConfigError
from vlp.models.embeddings.soho import SohoEmbedder
from vlp.models.vision.position_2d import sine_position_2d
from vlp.platform.finetune.finetune_config import load_finetune_config

torch.set_num_threads(1)


def finetune_model(tiny_world, **model):
    from vlp.platform.finetune.preflight import prepare
    from vlp.platform.finetune.run import components_for
    from vlp.platform.training.protocols import WorkerInfo

    cfg = load_finetune_config(data={
        "world": str(tiny_world), "benchmarks": ["vqa"], "mlflow": {"enabled": False},
        "model": {"family": "soho-tiny", "init": "random", **model}}).resolved_paths()
    _, _, _, options = cfg.settings_for("vqa")
    comp = components_for(cfg, "vqa", prepare(cfg), 2, options)
    torch.manual_seed(0)
    model = comp.build_model(None, [])
    src = comp.build_batch_source(None, None, 0, WorkerInfo(0, 1, 0, torch.device("cpu"), 0))
    embedder = next(m for m in model.modules() if isinstance(m, SohoEmbedder))
    batch = src.next("vqa")
    with torch.no_grad():   # a pre-trained dictionary: entries at the features' scale
        grid, valid, _ = embedder.encode_images(batch[K.PIXELS], batch.get(K.PIXEL_MASK))
        embedder.dictionary.initialise_from(grid[valid])
    return model, embedder, batch


def visual_tokens(model, embedder, batch) -> torch.Tensor:
    with torch.no_grad():
        return embedder(batch, model.backbone.text_embeddings).visual


def test_finetuning_input_is_the_feature_entering_the_dictionary(tiny_world):
    model, emb, batch = finetune_model(tiny_world)
    model.eval()
    assert emb.tokens == "features" and emb.dictionary.frozen
    got = visual_tokens(model, emb, batch)
    with torch.no_grad():    # the tokens by the formula, from the pre-dictionary grid
        grid, valid, (h, w) = emb.encode_images(batch[K.PIXELS], batch.get(K.PIXEL_MASK))
        pos = sine_position_2d(valid.view(-1, h, w), grid.shape[-1]).flatten(1, 2)
        want = emb.LayerNorm(grid + pos + model.backbone.text_embeddings.token_type(1))
    torch.testing.assert_close(got, want[batch[K.IMAGE_INDEX].long()])
    # new dictionary entries change nothing the model reads
    emb.dictionary.embedding.normal_()
    torch.testing.assert_close(visual_tokens(model, emb, batch), got)


def test_the_quantised_tokens_are_a_switch(tiny_world):
    model, emb, batch = finetune_model(tiny_world, visual_tokens="dictionary")
    model.eval()
    assert emb.tokens == "dictionary"
    before = visual_tokens(model, emb, batch)
    emb.dictionary.embedding.normal_()
    assert not torch.allclose(visual_tokens(model, emb, batch), before)


@pytest.mark.parametrize("tokens", ["features", "dictionary"])
def test_the_dictionary_does_not_move_over_finetune_steps(tiny_world, tokens):
    model, emb, batch = finetune_model(tiny_world, visual_tokens=tokens)
    model.train()
    entries = emb.dictionary.embedding.clone()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(3):
        out = model(batch, task="vqa")
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    assert emb.proj.weight.grad is not None and emb.proj.weight.grad.abs().sum() > 0
    torch.testing.assert_close(emb.dictionary.embedding, entries, rtol=0, atol=0)
    # asked for, the moving average runs
    emb.set_finetune_input(tokens, dictionary_updates=True)
    model(batch, task="vqa")
    assert not torch.equal(emb.dictionary.embedding, entries)


def test_the_switches_are_sohos_only():
    base = {"world": "w", "model": {"family": "uniter-tiny", "init": "random"}}
    for key, value in (("visual_tokens", "dictionary"), ("dictionary_updates", True)):
        with pytest.raises(ConfigError, match=f"model.{key}"):
            load_finetune_config(data={**base, "model": {**base["model"], key: value}})
