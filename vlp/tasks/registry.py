"""The task registry: the one list of pretraining tasks, and what derives from it.

Every module of the ``vlp.tasks`` package is imported once (``discover``, run when the package
is imported), and a task module registers its ``Task`` subclass with ``@register``; a module
elsewhere (a test, a plugin) may ``register`` a task of its own and ``unregister`` it. The
lists other layers need — the task names in mix-label order, their labels, the tasks a model
family accepts, the one text for a task given a visual input it does not work with — are
read from here, never kept apart.
"""

from __future__ import annotations

import importlib
import pkgutil

from vlp.tasks.spec import MODALITIES, VISUAL_INPUTS, Task

TASKS: dict[str, Task] = {}
_REQUIRED = ("name", "label", "head_name", "visual", "modality")
_discovered = False


def register(cls: type[Task]) -> type[Task]:
    """Class decorator: check the task's spec and add an instance under ``cls.name``."""
    missing = [a for a in _REQUIRED if not hasattr(cls, a)]
    if missing:
        raise TypeError(f"task class {cls.__name__} does not set {', '.join(missing)}")
    where = f"task {cls.name!r} ({cls.__module__}.{cls.__name__})"
    if cls.name in TASKS:
        raise ValueError(f"{where}: a task {cls.name!r} is already registered "
                         f"({type(TASKS[cls.name]).__module__})")
    if not cls.visual or not cls.visual <= VISUAL_INPUTS:
        raise ValueError(f"{where}: visual={sorted(cls.visual)}, expected a non-empty "
                         f"subset of {sorted(VISUAL_INPUTS)}")
    if cls.modality is not None and cls.modality not in MODALITIES:
        raise ValueError(f"{where}: modality={cls.modality!r}, expected one of "
                         f"{', '.join(MODALITIES)} or None")
    if cls.modality is not None and cls.mask is Task.mask:
        raise ValueError(f"{where} masks {cls.modality} but does not override mask()")
    TASKS[cls.name] = cls()
    return cls


def unregister(name: str) -> None:
    """Remove a task added with ``register`` (a test's own task, after the test)."""
    get_task(name)
    del TASKS[name]


def discover() -> None:
    """Import every module of ``vlp.tasks`` once; each task module registers its task."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    package = importlib.import_module("vlp.tasks")
    for info in pkgutil.iter_modules(package.__path__, "vlp.tasks."):
        importlib.import_module(info.name)


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown pretraining task {name!r}; known: "
                       f"{', '.join(task_names())}") from None


def task_order(name: str) -> int:
    """A task's place in mix labels (Table 3's reading order); unknown names go last."""
    return TASKS[name].order if name in TASKS else Task.order


def task_names() -> list[str]:
    """Every registered task, in mix-label order (ties by name)."""
    return sorted(TASKS, key=lambda n: (task_order(n), n))


def task_label(name: str) -> str:
    """``MRC-kl``: how mix labels spell a task (an unknown name in capitals)."""
    return TASKS[name].label if name in TASKS else name.upper()


def family_tasks(kind: str, input_kind: str) -> tuple[str, ...]:
    """The tasks a model family of embedder ``kind`` reading ``input_kind`` accepts."""
    return tuple(n for n in task_names()
                 if (TASKS[n].families is None or kind in TASKS[n].families)
                 and input_kind in TASKS[n].visual)


def visual_problem(name: str, visual: str, reader: str) -> str | None:
    """The one text for a task that does not work with the visual input ``reader`` gives
    (``reader``: "the data config", "soho-tiny", ...); None when it does."""
    needs = get_task(name).visual
    if visual in needs:
        return None
    return (f"task {name!r} needs visual input {' or '.join(sorted(needs))}; "
            f"{reader} reads {visual}")
