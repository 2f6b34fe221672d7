"""Downstream task tables for one split of the downstream image pool.

Every task reads the same scenes of the split (as VQA, RefCOCO+ and COCO retrieval share COCO
images), so a split's images are disjoint from the other splits' for every task at once.
"""

from __future__ import annotations

import numpy as np

from vlp.datasets.storage.task_tables import VE_LABELS
from vlp.datasets.synth.captions import coco_captions
from vlp.datasets.synth.grounding import referring_expressions, vcr_item
from vlp.datasets.synth.synthetic_image import stream
from vlp.datasets.synth.scales import ScaleConfig
from vlp.datasets.synth.scene import Scene
from vlp.datasets.synth.statements import nlvr2_item, ve_hypothesis
from vlp.datasets.synth.vqa import vqa_items

TASKS = ("vqa", "retrieval", "nlvr2", "ve", "refexp", "vcr")
TASK_CODES = {t: 100 + i for i, t in enumerate(TASKS)}
SPLIT_CODES = {"train": 0, "val": 1, "test": 2}


def build_task_tables(scenes: list[Scene], split: str, scale: ScaleConfig, seed: int
                      ) -> dict[str, dict[str, list]]:
    """task → columns (the TASK_SCHEMAS layout) for this split's scenes."""
    sc = SPLIT_CODES[split]

    def rng(task: str, k: int) -> np.random.Generator:
        return stream(seed, TASK_CODES[task], sc, k)

    vqa = {"question_id": [], "image_id": [], "question": [], "answers": []}
    ret = {"caption_id": [], "image_id": [], "caption": []}
    ve = {"id": [], "image_id": [], "hypothesis": [], "label": []}
    ref = {"ref_id": [], "image_id": [], "expression": [], "target_box": [], "gt_boxes": [],
           "target_gt_index": []}
    vcr = {"id": [], "image_id": [], "question": [], "answers": [], "answer_label": [],
           "rationales": [], "rationale_label": []}
    for k, s in enumerate(scenes):
        iid = s.image_id
        for j, (q, answers) in enumerate(vqa_items(s, rng("vqa", k), scale.vqa_per_image)):
            _add(vqa, question_id=f"{iid}_q{j}", image_id=iid, question=q, answers=answers)
        r = rng("retrieval", k)
        for j, c in enumerate(coco_captions(s, r, scale.retrieval_captions)):
            _add(ret, caption_id=f"{iid}_c{j}", image_id=iid, caption=c.text)
        r = rng("ve", k)
        for j, label in enumerate(r.permutation(VE_LABELS)[:scale.ve_per_image]):
            h = ve_hypothesis(s, r, str(label))
            if h is not None:
                _add(ve, id=f"{iid}_h{j}", image_id=iid, hypothesis=h, label=str(label))
        boxes = np.stack([o.box for o in s.objects]).astype(np.float32)
        for j, (expr, i) in enumerate(referring_expressions(s, rng("refexp", k),
                                                            scale.refexp_per_image)):
            _add(ref, ref_id=f"{iid}_r{j}", image_id=iid, expression=expr,
                 target_box=boxes[i].tolist(), gt_boxes=boxes.reshape(-1).tolist(),
                 target_gt_index=i)
        r = rng("vcr", k)
        made = 0
        for _ in range(5 * scale.vcr_per_image):
            item = vcr_item(s, r)
            if item is not None:
                q, ans, al, rat, rl = item
                _add(vcr, id=f"{iid}_v{made}", image_id=iid, question=q, answers=ans,
                     answer_label=al, rationales=rat, rationale_label=rl)
                made += 1
            if made == scale.vcr_per_image:
                break
    return {"vqa": vqa, "retrieval": ret, "nlvr2": _nlvr2(scenes, split, scale, seed),
            "ve": ve, "refexp": ref, "vcr": vcr}


def _nlvr2(scenes: list[Scene], split: str, scale: ScaleConfig, seed: int) -> dict[str, list]:
    out = {"id": [], "image_id_left": [], "image_id_right": [], "statement": [], "label": []}
    n = int(round(scale.nlvr2_per_image * len(scenes)))
    for k in range(n):
        r = stream(seed, TASK_CODES["nlvr2"], SPLIT_CODES[split], k)
        label = bool(r.random() < 0.5)
        item = nlvr2_item(scenes, r, label)
        if item is not None:
            i, j, text = item
            _add(out, id=f"nlvr2_{split}_{k:06d}", image_id_left=scenes[i].image_id,
                 image_id_right=scenes[j].image_id, statement=text, label=label)
    return out


def _add(cols: dict[str, list], **values) -> None:
    for k, v in values.items():
        cols[k].append(v)
