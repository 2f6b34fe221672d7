"""The peer ratio (issue 41's goals: vlp ÷ the official UNITER model, ≥ 3× per input unit):
vlp's model and the official ``UniterForPretraining`` trained on the same batches, their
steps alternated in one run, under the same autocast.

The reference is imported from a checkout of https://github.com/ChenRocks/UNITER (its
``model`` package; MIT code, never copied into vlp): ``make gpu-wheels UNITER_REPO=<checkout>``
carries the four files it needs to the GPU machine in ``.whl/uniter-reference``. Its apex
``FusedLayerNorm`` becomes ``torch.nn.LayerNorm`` (apex needs a CUDA build), as issue 41
says; nothing else is changed. Both models are built at the same size (the family's), with
the same feature width and class count, and each step is forward, backward and the same
optimizer (torch's AdamW, fused on CUDA) over fp32 weights, under bf16 autocast on CUDA.

Batches: ``vlp.testing``'s ``example_batch`` (handed in by the entry script), every sequence full length (the reference's ``gather_index``
is then the identity), vlp's masking; the reference gets the same tensors in its own keys
(``txt_labels`` -1 where vlp has -100, ``img_masks`` / ``img_mask_tgt`` from vlp's masked
regions, the masked rows' feature and soft-label targets; ITM without the optional OT
loss, as UNITER's pretraining config runs it). vlp's batches carry the host integers the
pretraining collate hands the model (``ROW_LENGTH``, ``REAL_UNITS``).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

import torch

from vlp.contract import batch_spec as bs

MIX = {"itm": 2, "mlm": 2, "mrfr": 1, "mrc-kl": 1}   # UNITER's in-domain mix
FILES = ("model/model.py", "model/layer.py", "model/pretrain.py", "model/ot.py")
CARRIED = Path(".whl") / "uniter-reference"   # where make gpu-wheels puts them
ENV = "UNITER_REPO"


def find_reference(explicit: str | None, root: Path) -> tuple[Path | None, str | None]:
    """The reference's folder (``--uniter-repo``, else $UNITER_REPO, else what make
    gpu-wheels carried under ``root``), or None and the one line that says why not."""
    for where, path in (("--uniter-repo", explicit), (f"${ENV}", os.environ.get(ENV)),
                        ("make gpu-wheels", str(root / CARRIED))):
        if not path:
            continue
        missing = [f for f in FILES if not (Path(path) / f).is_file()]
        if not missing:
            return Path(path), None
        if where != "make gpu-wheels":    # named, but not a checkout: say so
            return None, (f"{where} {path}: no {missing[0]} there; expected a checkout of "
                          f"https://github.com/ChenRocks/UNITER")
    return None, (f"no UNITER checkout: neither --uniter-repo nor ${ENV} is set and "
                  f"{root / CARRIED} does not exist (make gpu-wheels UNITER_REPO=<a checkout "
                  f"of https://github.com/ChenRocks/UNITER> carries it)")


def import_reference(repo: Path) -> tuple[type, type]:
    """``UniterConfig`` and ``UniterForPretraining`` from the checkout, apex's
    ``FusedLayerNorm`` as ``torch.nn.LayerNorm``."""
    fused = types.ModuleType("apex.normalization.fused_layer_norm")
    fused.FusedLayerNorm = torch.nn.LayerNorm
    for name in ("apex", "apex.normalization"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["apex.normalization.fused_layer_norm"] = fused
    sys.path.insert(0, str(repo))
    try:
        from model.model import UniterConfig
        from model.pretrain import UniterForPretraining
    finally:
        sys.path.remove(str(repo))
    return UniterConfig, UniterForPretraining


def reference_batch(batch: dict, task: str, text_len: int, regions: int) -> dict:
    """vlp's full-length batch in the reference's keys."""
    b = batch[bs.INPUT_IDS].shape[0]
    dev = batch[bs.INPUT_IDS].device
    out = {"input_ids": batch[bs.INPUT_IDS],
           "position_ids": torch.arange(text_len, device=dev)[None],
           "img_feat": batch[bs.REGION_FEATS].float(),
           "img_pos_feat": batch[bs.REGION_LOC].float(),
           "attn_masks": torch.ones(b, text_len + regions, dtype=torch.long, device=dev),
           "gather_index": torch.arange(text_len + regions, device=dev)[None].expand(
               b, -1).contiguous()}
    if task == "mlm":
        labels = batch[bs.MLM_LABELS]
        out["txt_labels"] = labels.masked_fill(labels == -100, -1)
    elif task == "itm":
        out["targets"] = batch[bs.POSITIVE].long()
    else:
        masked = batch[bs.REGION_MASKED]
        out["img_masks"] = masked
        out["img_mask_tgt"] = torch.cat(
            [torch.zeros(b, text_len, dtype=torch.bool, device=dev), masked], 1)
        if task == "mrfr":
            out["feat_targets"] = batch[bs.REGION_FEAT_TARGETS][masked].float()
        else:
            out["label_targets"] = batch[bs.REGION_SOFT_LABELS][masked].float()
    return out


def build_pair(repo: Path, family: str, feat_dim: int, num_classes: int) -> tuple:
    """(vlp's model, its preprocess spec, the reference model) at the family's size."""
    from vlp.models import create_model

    config_cls, reference_cls = import_reference(repo)
    torch.manual_seed(0)
    ours, spec, _ = create_model(family, tasks=list(MIX), region_feat_dim=feat_dim,
                                 num_classes=num_classes)
    cfg = ours.backbone.bert_config
    ref = reference_cls(
        config_cls(vocab_size_or_config_json_file=cfg.vocab_size,
                   hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
                   num_attention_heads=cfg.num_attention_heads,
                   intermediate_size=cfg.intermediate_size, hidden_act="gelu",
                   hidden_dropout_prob=cfg.hidden_dropout_prob,
                   attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
                   max_position_embeddings=cfg.max_position_embeddings,
                   type_vocab_size=cfg.type_vocab_size, initializer_range=0.02),
        img_dim=feat_dim, img_label_dim=num_classes)
    return ours, spec, ref


def peer_ratio(repo: Path, family: str, device: torch.device, make_batch: Callable, *,
               batch: int, text_len: int, regions: int, feat_dim: int, num_classes: int,
               steps: int, rounds: int, autocast: torch.dtype | None) -> dict[str, Any]:
    """Per task of UNITER's mix: seconds per input unit of each model's step, ``steps``
    steps a sample, the two models alternating ``rounds`` times (the order flipped every
    round) after two untimed steps each; the median sample of each; ``vlp_over_reference``
    is the reference's time over vlp's (> 1: vlp faster), for each task and for the mix.
    ``make_batch``: ``vlp.testing.example_batches.example_batch`` (a layer above this one:
    the entry script hands it over)."""
    ours, spec, ref = build_pair(repo, family, feat_dim, num_classes)
    ours.to(device).train()
    ref.to(device).train()
    fused = {"fused": True} if device.type == "cuda" else {}
    opts = {"vlp": torch.optim.AdamW(ours.parameters(), lr=1e-5, **fused),
            "reference": torch.optim.AdamW(ref.parameters(), lr=1e-5, **fused)}
    units = batch * (text_len + regions)
    out: dict[str, Any] = {
        "reference": str(repo), "reference_commit": _commit(repo), "family": family,
        "batch": [batch, text_len, regions], "input_units": units,
        "autocast": str(autocast) if autocast else None, "steps": steps, "rounds": rounds,
        "optimizer": "torch AdamW" + (" (fused)" if fused else "")}
    per_unit: dict[str, dict[str, float]] = {}
    for task in MIX:
        raw = {k: torch.as_tensor(v).to(device) for k, v in make_batch(
            spec, task, batch_size=batch, text_len=text_len, num_regions=regions,
            full_length=True, seed=1).items()}
        theirs = reference_batch(raw, task, text_len, regions)
        ours_batch = dict(raw)
        ours_batch[bs.ROW_LENGTH] = text_len + regions    # the collate's host integers
        ours_batch[bs.REAL_UNITS] = units
        steppers = {
            "vlp": _stepper(lambda: ours(ours_batch, task=task)["loss"], opts["vlp"],
                            device, autocast),
            "reference": _stepper(lambda: _reference_loss(ref, theirs, task),
                                  opts["reference"], device, autocast)}
        for step in steppers.values():
            step(2)
        times: dict[str, list[float]] = {k: [] for k in steppers}
        for r in range(rounds):
            order = list(steppers.items())
            for name, step in order if r % 2 == 0 else order[::-1]:
                times[name].append(step(steps) / (steps * units))
        per_unit[task] = {k: statistics.median(v) for k, v in times.items()}
        out[task] = {"vlp_s_per_input_unit": per_unit[task]["vlp"],
                     "reference_s_per_input_unit": per_unit[task]["reference"],
                     "vlp_over_reference": per_unit[task]["reference"] / per_unit[task]["vlp"],
                     "rounds_vlp": times["vlp"], "rounds_reference": times["reference"]}
    mix = {k: sum(MIX[t] * per_unit[t][k] for t in MIX) / sum(MIX.values())
           for k in ("vlp", "reference")}
    out["mix"] = {"vlp_s_per_input_unit": mix["vlp"],
                  "reference_s_per_input_unit": mix["reference"],
                  "vlp_over_reference": mix["reference"] / mix["vlp"]}
    out["vlp_over_reference"] = out["mix"]["vlp_over_reference"]
    return out


def _reference_loss(ref: torch.nn.Module, batch: dict, task: str) -> torch.Tensor:
    loss = ref(batch, task=task)
    return (loss[0] if task == "itm" else loss).mean()   # ITM: (loss, OT loss None)


def _stepper(loss_fn: Callable[[], torch.Tensor], opt: torch.optim.Optimizer,
             device: torch.device, autocast: torch.dtype | None) -> Callable[[int], float]:
    """``n`` training steps → their seconds, the device's work included."""
    def run(n: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=autocast or torch.bfloat16,
                                enabled=autocast is not None):
                loss = loss_fn()
            loss.backward()
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0
    return run


def _commit(repo: Path) -> str | None:
    """The checkout's commit: the COMMIT file make gpu-wheels writes, else git's HEAD."""
    stamp = repo / "COMMIT"
    if stamp.is_file():
        return stamp.read_text().strip() or None
    head = repo / ".git" / "HEAD"
    if not head.is_file():
        return None
    ref = head.read_text().strip()
    if ref.startswith("ref: "):
        target = repo / ".git" / ref[5:]
        return target.read_text().strip() if target.is_file() else ref[5:]
    return ref
