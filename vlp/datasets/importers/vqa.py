"""VQA v2: a questions file plus an annotations file → the ``vqa`` task table.

``v2_OpenEnded_mscoco_<subtype>_questions.json``: ``{"data_subtype": "train2014",
"questions": [{"image_id", "question", "question_id"}]}``;
``v2_mscoco_<subtype>_annotations.json``: ``{"annotations": [{"question_id", "image_id",
"answers": [{"answer", "answer_confidence", "answer_id"}] × 10, "multiple_choice_answer",
...}]}``. The two are told apart by their top-level key, so their order does not matter.
Rows keep the 10 raw answers (the answer vocabulary and soft scores are built later). The
test split has no annotations and cannot be a task table. Output:
``tasks/vqa/<split>.parquet`` with split train / val from ``data_subtype``.
"""

from __future__ import annotations

from pathlib import Path

from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.image_ids import canonical_image_id
from vlp.datasets.importers.readers import load_json, need, need_list
from vlp.datasets.importers.registry import Importer, ImportReport, register
from vlp.datasets.importers.task_import import (ALLOW_MISSING_IMAGES, IMAGES, NAME, TaskRows,
                                                write_tasks)

SUBTYPE_SPLITS = {"train2014": "train", "val2014": "val", "test2015": "test",
                  "test-dev2015": "test-dev"}


def run(inputs: list[Path], out: Path, *, overwrite: bool, name: str | None,
        images: str | None, allow_missing_images: bool) -> ImportReport:
    docs = {p: load_json(p) for p in inputs}
    q_files = [p for p, d in docs.items() if "questions" in d]
    a_files = [p for p, d in docs.items() if "annotations" in d]
    for p, d in docs.items():
        if p not in q_files and p not in a_files:
            raise InputFormatError(p, f"has neither 'questions' nor 'annotations' at the top "
                                      f"level (keys: {sorted(d)[:8]})")
    if len(q_files) != 1 or len(a_files) != 1:
        raise ValueError(f"vqa needs one questions file and one annotations file, got "
                         f"{len(q_files)} and {len(a_files)} (the test split has no "
                         f"annotations and cannot be imported)")
    qp, ap = q_files[0], a_files[0]
    answers: dict[int, tuple[str, list[str]]] = {}
    for i, a in enumerate(need_list(docs[ap], "annotations", ap)):
        rec = f"annotations[{i}]"
        qid = need(a, "question_id", int, ap, rec)
        rec = f"annotations[{i}] (question_id {qid})"
        image_id = canonical_image_id(need(a, "image_id", int, ap, rec))
        raw = need(a, "answers", list, ap, rec)
        texts = []
        for j, ans in enumerate(raw):
            texts.append(need(ans, "answer", str, ap, f"{rec}.answers[{j}]", nonempty=False))
        if not any(t.strip() for t in texts):
            raise InputFormatError(ap, "all answers are empty", rec)
        answers[qid] = (image_id, [t for t in texts if t.strip()])

    rows = TaskRows("vqa")
    for i, q in enumerate(need_list(docs[qp], "questions", qp)):
        rec = f"questions[{i}]"
        qid = need(q, "question_id", int, qp, rec)
        rec = f"questions[{i}] (question_id {qid})"
        image_id = canonical_image_id(need(q, "image_id", int, qp, rec))
        text = need(q, "question", str, qp, rec)
        if qid not in answers:
            raise InputFormatError(qp, f"question {qid} has no annotation in {ap.name}", rec)
        if answers[qid][0] != image_id:
            raise InputFormatError(qp, f"image {image_id} here but {answers[qid][0]} in "
                                       f"{ap.name}", rec)
        rows.add(qp, rec, question_id=str(qid), image_id=image_id, question=text.strip(),
                 answers=answers[qid][1])
    subtype = docs[qp].get("data_subtype")
    split = name or SUBTYPE_SPLITS.get(subtype)
    if split is None:
        raise InputFormatError(qp, f"data_subtype {subtype!r} is not one of "
                                   f"{sorted(SUBTYPE_SPLITS)}: pass --name to name the table")
    return write_tasks("vqa", {split: rows}, inputs, out, overwrite=overwrite, images=images,
                       allow_missing_images=allow_missing_images,
                       options={"name": name, "images": images},
                       meta={"dataset": "vqa-v2", "data_subtype": subtype})


register(Importer(
    name="vqa", kind="task",
    summary="VQA v2 questions + annotations JSON → vqa task table",
    inputs="v2_OpenEnded_mscoco_<subtype>_questions.json v2_mscoco_<subtype>_annotations.json "
           "(any order)",
    description="One row per question: question_id, image_id (COCO id), question, the 10 raw "
                "annotator answers. Written to OUT/tasks/vqa/<split>.parquet, split from "
                "data_subtype (train2014 → train, val2014 → val).",
    run=run, min_inputs=2, max_inputs=2,
    options=(NAME, IMAGES, ALLOW_MISSING_IMAGES)))
