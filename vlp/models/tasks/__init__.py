"""Pretraining tasks, one file each; importing this package registers them all."""

from . import itm, mlm, moc, mrc, mrc_kl, mrc_vlbert, mrfr, mvm, wra  # noqa: F401  (registration)
from .base import TASKS, HeadContext, Task, get_task, register_task

__all__ = ["TASKS", "HeadContext", "Task", "get_task", "register_task"]
