"""Issue 29, SOHO: BERT into a shallower Transformer takes BERT's first L layers (SOHO §4.1
initialises its 3-layer ablation model from BERT), widths that differ are refused; the step
schedule (×0.1 at epochs 25 and 35 of 40, §4.1) for both optimizers."""

from __future__ import annotations

import logging

import pytest
import torch

from vlp.models.checkpoints.state_dict_io import CheckpointError, read_state_dict
from vlp.models.checkpoints.text_bert import minilm_dir
from vlp.models.factory import create_model


def test_bert_into_three_layers_loads_the_first_three_layers_exactly(caplog):
    with caplog.at_level(logging.INFO, logger="vlp.models.checkpoints.text_bert"):
        model, _, report = create_model("uniter-minilm", ["mlm"], init="minilm",
                                        overrides={"transformer.num_layers": 3})
    bert = read_state_dict(minilm_dir() / "model.safetensors")
    ours = model.state_dict()
    compared = 0
    for key, value in bert.items():
        name = key.removeprefix("bert.")
        if name.startswith("encoder.layer."):
            layer = int(name.split(".")[2])
            if layer < 3:
                assert torch.equal(ours["backbone." + name], value.float()), key
                compared += 1
            else:
                assert key in report.dropped and "first 3" in report.dropped[key]
    assert compared == 3 * 16   # every tensor of layers 0-2
    assert torch.equal(ours["backbone.text_embeddings.word_embeddings.weight"],
                       bert["embeddings.word_embeddings.weight"].float())
    assert any("6 encoder layers into a 3-layer model" in r.getMessage()
               for r in caplog.records)


def test_bert_of_another_width_is_refused():
    with pytest.raises(CheckpointError, match="shape"):
        create_model("uniter-minilm", ["mlm"], init="minilm",
                     overrides={"transformer.num_layers": 3, "transformer.hidden_size": 192,
                                "transformer.intermediate_size": 768,
                                "transformer.num_heads": 6})
