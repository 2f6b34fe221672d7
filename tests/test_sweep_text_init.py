"""The world-text init: text-only MLM weights of a family's size, trained on the world's
captions, enter the model through the ordinary bert:<path> initialiser (every key placed)."""

from __future__ import annotations

import torch

from vlp.models import create_model
from vlp.platform.sweep.text_init import make_text_init


def test_text_only_weights_load_into_the_family(tiny_world, tmp_path):
    lines = []
    path = make_text_init("uniter-tiny", world=str(tiny_world), out=str(tmp_path / "ti"),
                          steps=4, batch_size=8, say=lines.append)
    assert path.endswith("model.safetensors") and "text-only MLM" in lines[0]
    bundle = create_model("uniter-tiny", ["mlm", "itm"], init=f"bert:{path}",
                          region_feat_dim=64, num_classes=17)
    from safetensors.torch import load_file

    saved = load_file(path)
    ours = bundle.model.state_dict()
    word = "backbone.text_embeddings.word_embeddings.weight"
    assert torch.equal(ours[word], saved["bert.embeddings.word_embeddings.weight"])
    assert torch.equal(ours["backbone.encoder.layer.1.output.dense.weight"],
                       saved["bert.encoder.layer.1.output.dense.weight"])
    # cached: a second call trains nothing
    again = []
    assert make_text_init("uniter-tiny", world=str(tiny_world), out=str(tmp_path / "ti"),
                          say=again.append) == path and "reusing" in again[0]
