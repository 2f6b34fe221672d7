"""Pretraining tasks, one file each; importing this package registers them all.

A task file holds everything about its task: a ``Task`` subclass (``spec.py``) whose class
attributes say what the task is — name, mix label and order, the modality it masks, the
visual inputs it works with, the model families it applies to, what its batches need (soft
labels, ITM negatives, the whole-image feature, ...) — and whose methods are its masking
policy (``mask``, run by the data pipeline), its head (``build_head``) and its loss
(``compute``, reporting ``{name}_loss``). ``registry.py`` is the only list of tasks: the
config checks, the families' task lists, the sweep's labels and order and the example
batches all read it.

Adding a task = one new file here::

    @register
    class RegionCount(Task):
        name, label = "count", "COUNT"
        head_name, modality, visual = "count", "regions", frozenset({"regions"})
        families = frozenset({"uniter"})          # None: every family of its visual input
        def mask(self, batch, rng, ctx): ...      # numpy, in place; targets on positives only
        def build_head(self, ctx): ...
        def compute(self, head, enc, batch): ...  # {"count_loss": ...}

Every module of this package is imported when it is (``registry.discover``), so nothing else
is edited. A task defined elsewhere (a test) calls ``register`` itself and ``unregister``
after; it exists only in the process that registered it (Ray workers import this package,
not the test). Shared pieces: ``masking_text`` (BERT's masking), ``masking_visual`` (region
choice, zeroing, SOHO's image flags), ``masking_modes`` (conditional / joint masking),
``losses`` (zero_loss, accuracy, masked_regions).

Imports only ``vlp.contract``, torch and numpy.
"""

from vlp.tasks.masking_modes import apply_group_masking, apply_masking
from vlp.tasks.registry import (TASKS, discover, family_tasks, get_task, register, task_label,
                                task_names, task_order, unregister, visual_problem)
from vlp.tasks.spec import HeadContext, MaskContext, Task

discover()

__all__ = ["TASKS", "HeadContext", "MaskContext", "Task", "apply_group_masking", "apply_masking",
           "family_tasks", "get_task", "register", "task_label", "task_names", "task_order",
           "unregister", "visual_problem"]
