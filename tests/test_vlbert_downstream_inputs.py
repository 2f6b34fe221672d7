"""Issue 29: VL-BERT's VQA input as its paper (§4.2.2): ``[CLS] question [SEP] [MASK] [SEP]``,
the [MASK] in the answer segment (B), the answer classified from the [MASK]'s output; UNITER
keeps the pooled [CLS] (the benchmark's ``answer_token``)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import torch

from vlp.benchmarks.vqa import normalize_vqa_answer, vqa_target_score
from vlp.contract import batch_spec as K
from vlp.contract import downstream_keys as D
from vlp.datasets.downstream.vqa import AnswerVocab, VqaData
from vlp.datasets.storage.world import load_manifest
from vlp.models import create_model
from vlp.models.heads import DownstreamModel, build_head
from vlp.datasets.downstream.downstream_config import data_config_for


def test_vlbert_vqa_classifies_the_appended_mask_token(tiny_world):
    torch.manual_seed(0)
    model, spec, _ = create_model("vlbert-tiny", ["itm"], region_feat_dim=64,
                                  overrides={"transformer.hidden_dropout": 0.0,
                                             "transformer.attention_dropout": 0.0})
    answers = pq.read_table(load_manifest(tiny_world).task_file("vqa", "train")).column("answers")
    vocab = AnswerVocab.build(answers.to_pylist(), normalize_vqa_answer, vqa_target_score)
    data = VqaData(data_config_for(spec, str(tiny_world)), "train", vocab, "mask", 1)
    idx = np.arange(6)
    batch = data.batch(idx)
    ids, types = batch[K.INPUT_IDS], batch[K.TEXT_TYPE_IDS]
    pos = batch[D.ANSWER_POSITION]
    rows = torch.arange(len(idx))
    q = torch.from_numpy(data.questions.lengths(idx))
    assert torch.equal(pos, q + 2)                                # [CLS] question [SEP] [MASK]
    assert (ids[rows, pos] == data.tok.mask_id).all()
    assert (ids[rows, pos + 1] == data.tok.sep_id).all()
    assert (types[rows, pos] == 1).all() and (types[rows, pos - 1] == 0).all()
    assert torch.equal(batch[K.TEXT_MASK].sum(1), q + 4)
    head = build_head("soft-score-classifier", name="vqa", hidden=64, num_answers=len(vocab),
                      from_token=True)
    full = DownstreamModel(model.backbone, head).eval()
    logits = full.predict(batch)
    enc = model.backbone(batch, pool=False)
    want = head.mlp(enc.sequence_output[rows, enc.text_positions[rows, pos]])
    torch.testing.assert_close(logits, want)
    assert not torch.allclose(logits, head.mlp(enc.sequence_output[:, 0]))   # not [CLS]


def test_the_family_decides_where_vqa_reads_its_answer():
    from types import SimpleNamespace

    from vlp.benchmarks.vqa import VqaOptions, answer_token
    from vlp.models.families import get_family

    def ctx(family, **options):
        return SimpleNamespace(family=get_family(family), options=VqaOptions(**options))

    assert answer_token(ctx("vlbert-tiny")) == "mask"
    assert answer_token(ctx("uniter-tiny")) == "cls"
    assert answer_token(ctx("vlbert-tiny", answer_token="cls")) == "cls"
