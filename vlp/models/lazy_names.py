"""A package's names loaded on first use (PEP 562): ``vlp.models`` and ``vlp.models.checkpoints``
export names whose modules import transformers' BERT, and importing a light submodule of
either (the extractor registry, ``state_dict_io``) must not pay for those."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, where: dict[str, str], namespace: dict[str, Any]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``where`` maps each name to the module
    that defines it; a name is imported on first use and kept in ``namespace`` (the
    package's globals)."""

    def getattr_(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(where))

    return getattr_, dir_
