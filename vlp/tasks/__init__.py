"""Pretraining tasks, one file each; importing this package registers them all."""

from vlp.tasks import itm, mlm, mlm_obj, moc, mrc, mrc_kl, mrc_vlbert, mrfr, mvm, mlm_text, sirp, wra  # (registration)
from vlp.tasks.base import TASKS, HeadContext, Task, get_task, register_task

__all__ = ["TASKS", "HeadContext", "Task", "get_task", "register_task"]
