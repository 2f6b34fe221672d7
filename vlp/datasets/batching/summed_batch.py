"""The ``summed`` objective's micro-batch: one example set, a batch per task built from it.

ImageBERT trains its four tasks "simultaneously" and SOHO's objective is L = L_MLM + L_MVM +
L_ITM (Eq. 9): every task's loss on the same examples, one backward. Each task still gets its
own batch of those examples — its own masking (conditional masking: one modality per task)
and, for ITM, its own negatives — from a generator of its own, keyed by the set's place in
its epoch and the task's place in the mix, so a batch depends on neither the tasks before it
nor the prefetch.

SOHO's image groups carry negative texts (``pos_texts_per_image`` true captions and
``neg_texts_per_image`` captions of other images): only ITM reads them, so the other tasks'
batches hold the true pairs only (their losses skip negatives anyway; the sampled objective
forwards them for nothing). Region input has no such rows (ITM negatives are swapped inside
ITM's own batch), so there every task sees the whole set.

Every pixel task's batch holds the set's images in the same order (each image has a true
pair), which lets the model encode them once for all tasks (``images_encoded_once``).

The set is counted once: its examples and input units are its largest task batch's (the
whole set wherever a task reads every example, ITM included).

Tasks of one forward group (``TaskSet.groups``) share one batch (each modality masked once,
``apply_group_masking``) and one forward: ``TASK_BATCHES`` holds that batch once, under the
group's first task. VL-BERT's group is its whole mix (words and RoIs masked in the same example, the
reference code's one forward per example); ImageBERT's is MOC + MRFR (one masked region set
m_I, §4.3 of its paper).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Mapping

import numpy as np
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.batching.collate import ExampleRefs, image_idents
from vlp.datasets.batching.image_block import ImageBlock
from vlp.datasets.batching.task_batch import task_batch
from vlp.datasets.stream.data_plan import DataPlan
from vlp.datasets.stream.text_tokenizer import TextTokenizer
from vlp.tasks import MaskContext, get_task


def task_refs(refs: ExampleRefs, task: str) -> ExampleRefs:
    """The examples ``task``'s batch is built from: all of them for a task that reads ITM
    labels, else the true pairs only (SOHO's negative texts serve ITM alone)."""
    if get_task(task).itm_negatives or refs.positive.all():
        return refs
    return refs.take(np.flatnonzero(refs.positive))


def summed_batch(plan: DataPlan, tok: TextTokenizer, ctx: MaskContext,
                 blocks: Mapping[int, ImageBlock], refs: ExampleRefs, tasks: tuple[str, ...],
                 rng_of: Callable[[int], np.random.Generator], stats: Counter | None = None,
                 *, with_ids: bool = False, collated: dict | None = None,
                 text_only: Callable[[str], dict[str, torch.Tensor]] | None = None,
                 shapes=None) -> dict:
    """``{TASK_BATCHES: {task: batch}, NUM_EXAMPLES, INPUT_UNITS}`` for the example set
    ``refs`` (a forward group's batch under its first task); ``rng_of(i)``: the generator
    of the i-th task of ``tasks`` (a group: its first task's); ``collated``: the set's
    unmasked arrays (region input), copied per batch since masking writes in place;
    ``text_only(task)``: the batch of a text-only task (VL-BERT's corpus MLM: not the set's
    examples, so not counted); ``shapes``: ``task_batch``'s."""
    per_task: dict[str, dict[str, torch.Tensor]] = {}
    examples = units = 0
    images = None   # the set's images, as the first pixel task's batch holds them
    forwards = tasks.forwards() if hasattr(tasks, "forwards") else [(t,) for t in tasks]
    for group in forwards:
        task, i = group[0], tasks.index(group[0])   # a group's generator: its first task's
        if get_task(task).text_only:
            if text_only is None:
                raise ValueError(f"task {task!r} reads the text corpus; this loader has none")
            per_task[task] = text_only(task)
            continue
        mine = refs if any(get_task(t).itm_negatives for t in group) else task_refs(refs, task)
        if collated is not None and len(mine) != len(refs):
            raise ValueError("collated arrays cover the whole example set; a task needing a "
                             "subset must collate its own (pixel input)")
        copy = None if collated is None else {
            k: v.copy() if isinstance(v, np.ndarray) else v for k, v in collated.items()}
        batch = task_batch(plan, tok, ctx, blocks, mine, group if len(group) > 1 else task,
                           rng_of(i), stats, with_ids=with_ids, collated=copy, shapes=shapes)
        if K.PIXELS in batch:   # the model encodes them once for every task (running_stats)
            mine_images = np.unique(image_idents(mine))
            if images is None:
                images = mine_images
            elif not np.array_equal(images, mine_images):
                raise ValueError(f"task {task!r}'s batch holds other images than "
                                 f"{tasks[0]!r}'s: a summed example set's pixel batches must "
                                 f"share their images (every image needs a true pair)")
        per_task[task] = batch
        examples = max(examples, int(batch[K.NUM_EXAMPLES]))
        units = max(units, int(batch[K.INPUT_UNITS]))
    return {K.TASK_BATCHES: per_task, K.NUM_EXAMPLES: torch.tensor(examples),
            K.INPUT_UNITS: torch.tensor(units)}
