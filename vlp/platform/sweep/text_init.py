"""Text-only MLM weights for a model family that no published BERT fits (the tiny debug
families): UNITER Table 3's line 2 — "MLM initialised with pretrained BERT weights, trained
on text only" — needs them, and lines 3-13 start from them.

    path = make_text_init("uniter-tiny", world="runs/demo/world", out="runs/demo/text-init")
    # then the sweep's model.text_init: bert:<path>
    uri = text_init_in_storage("uniter-tiny", world=..., storage=open_location("s3://b/vlp"),
                               folder="text-init/uniter-tiny-1a2b3c4d", local="runs/demo/ti")

A Hugging Face ``BertForPreTraining`` of the family's transformer size (vocabulary, hidden,
layers, heads) is trained with BERT's masked-LM objective (15% of word pieces; 80% [MASK],
10% random, 10% kept) on the captions of the world's pretraining corpora as plain text: no
image ever enters. It stands in for the text corpus BERT was trained on; the weights then
enter any family through the ordinary ``bert:<path>`` initialiser, which checks every key.
This is not the platform's training loop (no Ray, no DeepSpeed, no images): a small
text-only model is trained in one process in a minute or two, once per world and family.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

MASK_PROB = 0.15


def _print(text: str) -> None:
    print(text, flush=True)


def captions_of(world: str, limit: int = 200_000) -> list[str]:
    """The captions of the world's in- and out-of-domain pretraining corpora."""
    import pyarrow.parquet as pq

    from vlp.contract.uri_files import open_input
    from vlp.datasets.storage.world import load_manifest

    m = load_manifest(world)
    out: list[str] = []
    for name in m.pretraining_sources():
        for f in m.image_files(source=name):
            table = pq.read_table(open_input(f), columns=["captions"])
            for caps in table.column("captions").to_pylist():
                out.extend(c for c in caps or () if c)
                if len(out) >= limit:
                    return out
    return out


def make_text_init(family: str, *, world: str, out: str, steps: int = 600,
                   batch_size: int = 64, lr: float = 2e-3, seed: int = 0,
                   say: Callable[[str], None] = _print) -> str:
    """Train (or reuse) the text-only weights; returns the ``model.safetensors`` path."""
    import numpy as np
    import torch
    from transformers import BertConfig, BertForPreTraining

    from vlp.datasets.stream.text_tokenizer import load_tokenizer
    from vlp.models import get_family

    target = Path(out) / "model.safetensors"
    if target.is_file():
        say(f"[text-init] reusing {target}")
        return str(target)
    t = get_family(family).transformer
    tok = load_tokenizer(None)
    if tok.vocab_size != t.vocab_size:
        raise ValueError(f"{family} has a {t.vocab_size}-token vocabulary; the packaged "
                         f"tokenizer has {tok.vocab_size}")
    texts = captions_of(world)
    if not texts:
        raise ValueError(f"{world}: no pretraining captions to train a text model on")
    flat, lengths = tok.encode(texts)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                     num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads,
                     intermediate_size=t.intermediate_size,
                     max_position_embeddings=t.max_position_embeddings,
                     type_vocab_size=2, layer_norm_eps=t.layer_norm_eps)
    model = BertForPreTraining(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10)) * max(0.0, 1 - s / steps))
    say(f"[text-init] {family}: text-only MLM on {len(texts):,} captions of {world}, "
        f"{steps} steps × {batch_size}")
    model.train()
    threads = torch.get_num_threads()
    # one thread: matrices this small gain nothing from two, and on a busy machine the
    # second thread's spin-waits cost several times the work
    torch.set_num_threads(1)
    try:
        _train(model, opt, sched, steps, batch_size, flat, starts, lengths, tok, rng, say)
    finally:
        torch.set_num_threads(threads)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{os.getpid()}"
    model.save_pretrained(tmp, safe_serialization=True)
    os.replace(tmp / "model.safetensors", target)
    (tmp / "config.json").replace(target.parent / "config.json")
    tmp.rmdir()
    return str(target)


def text_init_in_storage(family: str, *, world: str, storage: Any, folder: str, local: str,
                         say: Callable[[str], None] = _print, **train: Any) -> str:
    """The text-only weights in the run storage ``storage`` (a ``RunStorage``) under
    ``folder``, where trials on any node read them: a local storage holds them in place
    (``make_text_init``); a URI gets them trained (or reused) in the local folder ``local``
    and copied in, each file atomically, unless already there. Returns the weights' path or
    URI; readers fetch a URI into their node's cache (``weights_location.fetch``)."""
    name = "model.safetensors"
    if storage.is_local:
        return make_text_init(family, world=world, out=storage.uri(folder), say=say, **train)
    uri = storage.uri(folder, name)
    if storage.exists(folder, name):
        say(f"[text-init] reusing {uri}")
        return uri
    path = Path(make_text_init(family, world=world, out=local, say=say, **train))
    # the weights last: their presence says the folder is complete
    storage.upload(path.parent / "config.json", folder, "config.json")
    storage.upload(path, folder, name)
    say(f"[text-init] copied to {uri}")
    return uri


def _train(model, opt, sched, steps, batch_size, flat, starts, lengths, tok, rng,
           say) -> None:
    import torch

    for step in range(1, steps + 1):
        pick = rng.integers(0, len(starts), batch_size)
        ids, labels, mask = _mlm_batch(flat, starts, lengths, pick, tok, rng)
        # the vocabulary projection only on the masked positions (the rest cost 30k logits
        # each and carry no loss)
        hidden = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        masked = labels != -100
        logits = model.cls.predictions(hidden[masked])
        loss = torch.nn.functional.cross_entropy(logits, labels[masked])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        sched.step()
        if step % max(1, steps // 5) == 0 or step == steps:
            say(f"[text-init] step {step}/{steps} mlm loss {loss.item():.3f}")


def _mlm_batch(flat, starts, lengths, pick, tok, rng, max_len: int = 40):
    """[CLS] caption [SEP] rows, padded; BERT's 80/10/10 masking with at least one target."""
    import numpy as np
    import torch

    rows = [flat[starts[i]:starts[i] + min(lengths[i], max_len - 2)] for i in pick]
    width = max(len(r) for r in rows) + 2
    ids = np.full((len(rows), width), tok.pad_id, np.int64)
    labels = np.full_like(ids, -100)
    for k, r in enumerate(rows):
        ids[k, 0], ids[k, len(r) + 1] = tok.cls_id, tok.sep_id
        ids[k, 1:len(r) + 1] = r
        if not len(r):
            continue
        chosen = rng.random(len(r)) < MASK_PROB
        if not chosen.any():
            chosen[rng.integers(len(r))] = True
        pos = np.flatnonzero(chosen) + 1
        labels[k, pos] = ids[k, pos]
        roll = rng.random(len(pos))
        ids[k, pos[roll < 0.8]] = tok.mask_id
        swap = pos[(roll >= 0.8) & (roll < 0.9)]
        ids[k, swap] = rng.choice(tok.random_ids, len(swap))
    mask = (ids != tok.pad_id).astype(np.int64)
    return torch.from_numpy(ids), torch.from_numpy(labels), torch.from_numpy(mask)
