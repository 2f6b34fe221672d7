"""Initialisers and converters: UNITER layout round trip, text-only BERT/MiniLM init, and
broken checkpoints failing with the offending key named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertForPreTraining

from vlp.models import CheckpointError, create_model, export_uniter, load_uniter, save_uniter
from vlp.models.checkpoints import load_bert_path, minilm_dir, read_state_dict

torch.set_num_threads(1)

UNITER_TASKS = ["mlm", "itm", "mrfr", "mrc-kl"]


def _uniter(seed: int, **kwargs):
    torch.manual_seed(seed)
    return create_model("uniter-tiny", tasks=UNITER_TASKS, region_feat_dim=16, num_classes=9,
                        **kwargs).model


def _assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_uniter_round_trip_is_exact(tmp_path):
    ours = _uniter(0)
    exported = export_uniter(ours)
    assert "uniter.img_embeddings.mask_embedding.weight" in exported
    assert "uniter.encoder.layer.1.attention.self.query.weight" in exported
    # tied tensors appear twice, as in the release
    assert torch.equal(exported["cls.predictions.decoder.weight"],
                       exported["uniter.embeddings.word_embeddings.weight"])
    assert torch.equal(exported["feat_regress.weight"],
                       exported["uniter.img_embeddings.img_linear.weight"])
    back = _uniter(1)
    report = load_uniter(back, exported)
    _assert_same_state(ours, back)
    assert not report.random_init and not report.dropped
    # through a file and the factory's init string
    path = save_uniter(ours, tmp_path / "uniter-tiny.pt")
    again = create_model("uniter-tiny", tasks=UNITER_TASKS, region_feat_dim=16, num_classes=9,
                         init=f"uniter:{path}").model
    _assert_same_state(ours, again)
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary


RELEASE_KEYS = Path(__file__).parent / "data" / "uniter_base_release_keys.txt"
TIED = {"cls.predictions.decoder.weight": "uniter.embeddings.word_embeddings.weight",
        "feat_regress.weight": "uniter.img_embeddings.img_linear.weight"}


def _release_layout() -> dict[str, tuple[int, ...]]:
    rows = [line.split("\t") for line in RELEASE_KEYS.read_text().splitlines()
            if line and not line.startswith("#")]
    return {key: tuple(int(n) for n in shape.split()) for key, shape in rows}


def test_the_official_uniter_base_layout_loads_and_exports_unchanged():
    """A state dict with every key and shape of the released uniter-base.pt (the committed
    list, written from UNITER's code, not from ours), fp16 as released, distinct values per
    tensor: loading it must consume every key and exporting must give back exactly it."""
    layout = _release_layout()
    assert len(layout) == 230 and set(TIED) <= set(layout)
    g = torch.Generator().manual_seed(0)
    release = {k: torch.randn(shape, generator=g).half() for k, shape in layout.items()}
    for copy, original in TIED.items():
        release[copy] = release[original]
    release["uniter.img_embeddings.mask_embedding.weight"][0] = 0   # padding_idx=0 row
    model = create_model("uniter-base", tasks=UNITER_TASKS, vocab_size=28996).model
    report = load_uniter(model, release)
    assert not report.random_init and not report.dropped
    exported = export_uniter(model, dtype=torch.float16)
    assert sorted(exported) == sorted(layout)
    for key, value in release.items():
        assert exported[key].shape == value.shape, key
        assert torch.equal(exported[key], value), key


def test_fp16_release_with_gamma_beta_names_loads():
    ours = _uniter(0)
    release = {}
    for key, value in export_uniter(ours, dtype=torch.float16).items():
        if "LayerNorm" in key or "layer_norm" in key or key.startswith("feat_regress.net.2"):
            key = key.replace(".weight", ".gamma").replace(".bias", ".beta")
        release[key] = value
    assert any(k.endswith("gamma") for k in release)
    back = _uniter(1)
    load_uniter(back, release)
    word = back.backbone.text_embeddings.word_embeddings.weight
    assert word.dtype == torch.float32
    assert torch.equal(word, ours.backbone.text_embeddings.word_embeddings.weight.half().float())
    ln = back.backbone.encoder.layer[0].output.LayerNorm.weight
    assert torch.equal(ln, ours.backbone.encoder.layer[0].output.LayerNorm.weight.half().float())


def _broken(edit):
    state = export_uniter(_uniter(0))
    edit(state)
    return state


@pytest.mark.parametrize("edit,key", [
    (lambda s: s.pop("uniter.encoder.layer.1.output.dense.weight"),
     "uniter.encoder.layer.1.output.dense.weight"),
    (lambda s: s.update({"uniter.img_embeddings.img_linear.weight": torch.zeros(64, 20)}),
     "uniter.img_embeddings.img_linear.weight"),
    (lambda s: s.update({"uniter.encoder.layer.7.output.dense.bias": torch.zeros(64)}),
     "uniter.encoder.layer.7.output.dense.bias"),
    (lambda s: s.pop("itm_output.bias"), "itm_output.bias"),
    (lambda s: s.update({"cls.predictions.decoder.weight":
                         s["cls.predictions.decoder.weight"] + 1}),
     "cls.predictions.decoder.weight"),
])
def test_broken_uniter_checkpoints_name_the_key(edit, key):
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        load_uniter(_uniter(1), _broken(edit))


def test_wrong_vocabulary_size_names_the_key():
    state = _broken(lambda s: None)
    for key in ("uniter.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"):
        state[key] = torch.zeros(28996, 64)
    state["cls.predictions.bias"] = torch.zeros(28996)
    with pytest.raises(CheckpointError, match=r"'uniter\.embeddings\.word_embeddings\.weight'.*"
                                              r"vocabulary size 28996"):
        load_uniter(_uniter(1), state)
    # the release's bert-base-cased vocabulary fits a model built for it
    cased = _uniter(1, vocab_size=28996)
    load_uniter(cased, state)
    assert cased.backbone.text_embeddings.word_embeddings.weight.shape[0] == 28996


def test_heads_missing_or_extra_are_reported_not_silent():
    state = export_uniter(_uniter(0))
    for key in [k for k in state if k.startswith("region_classifier.")]:
        del state[key]
    report = load_uniter(_uniter(1), state)
    assert "heads.region_classifier.net.0.weight" in report.random_init
    itm_only = create_model("uniter-tiny", tasks=["itm"], region_feat_dim=16, num_classes=9).model
    report = load_uniter(itm_only, export_uniter(_uniter(0)))
    assert report.dropped["cls.predictions.bias"] == "the model has no mlm head"
    assert "feat_regress.weight" in report.dropped


def test_minilm_init_loads_the_packaged_weights():
    model, spec, report = create_model("uniter-minilm", tasks=["mlm", "itm"], init="minilm")
    package = load_file(str(minilm_dir() / "model.safetensors"))
    assert torch.equal(model.backbone.text_embeddings.word_embeddings.weight,
                       package["embeddings.word_embeddings.weight"])
    assert torch.equal(model.backbone.encoder.layer[5].output.dense.weight,
                       package["encoder.layer.5.output.dense.weight"])
    assert torch.equal(model.backbone.pooler.dense.bias, package["pooler.dense.bias"])
    words = model.backbone.text_embeddings.word_embeddings.weight
    assert model.heads["mlm"].decoder.weight is words
    assert "backbone.visual.img_linear.weight" in report.random_init
    assert "embeddings.position_ids" in report.dropped
    assert spec.vocab_file.startswith(str(minilm_dir()))
    # VL-BERT's third segment row starts random; BERT's two rows are copied
    vl, _, vl_report = create_model("vlbert-minilm", tasks=["itm"], init="minilm")
    rows = vl.backbone.text_embeddings.token_type_embeddings.weight
    assert rows.shape[0] == 3
    assert torch.equal(rows[:2], package["embeddings.token_type_embeddings.weight"])
    assert "backbone.text_embeddings.token_type_embeddings.weight" in vl_report.partial


def test_minilm_into_a_model_of_another_width_names_the_key():
    with pytest.raises(CheckpointError, match=r"checkpoint key 'embeddings\.\S+' has shape "
                                              r"\[384\] but the model expects \[64\]"):
        create_model("uniter-tiny", tasks=["itm"], init="minilm")


def test_bert_folder_init(tmp_path):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=256)
    bert = BertForPreTraining(config)
    bert.save_pretrained(tmp_path)
    model, _, report = create_model("uniter-tiny", tasks=["mlm"], init=f"bert:{tmp_path}")
    assert torch.equal(model.backbone.encoder.layer[1].attention.self.key.weight,
                       bert.bert.encoder.layer[1].attention.self.key.weight)
    assert torch.equal(model.heads["mlm"].transform.dense.weight,
                       bert.cls.predictions.transform.dense.weight)
    assert any(k.startswith("cls.seq_relationship") for k in report.dropped)
    # a state_dict file with an unknown key fails naming it
    state = read_state_dict(tmp_path)
    state["bert.visual_adapter.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=r"bert\.visual_adapter\.weight"):
        load_bert_path(model, tmp_path / "bad.pt")


def test_checkpoint_files_load_without_pickled_code(tmp_path):
    torch.save({"uniter.pooler.dense.bias": torch.zeros(64), "step": 3}, tmp_path / "x.pt")
    with pytest.raises(CheckpointError, match="'step'"):
        read_state_dict(tmp_path / "x.pt")
