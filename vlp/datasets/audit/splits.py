"""Which task-table splits a model trains on and which it is evaluated on, from their names.

Real benchmarks do not name their splits ``train / val / test``: RefCOCO+ has
``refcoco+_testA``, Karpathy retrieval ``flickr30k_test``, NLVR2 ``dev`` and ``test1``, VQA
``minival`` and ``test-dev``, the Karpathy COCO split ``restval``. A split name is cut into
words at ``_ - . +`` and spaces; a word such as ``train``, ``restval``, ``trainval`` (digits may
follow: ``train2014``) makes it a training split, one such as ``val``, ``dev``, ``minival``,
``test``, ``testA``, ``testB`` (``test1``, ``val2014``) an evaluation split. A name with words of
both kinds, or of neither, has no role until the user gives it one (``--split-role``): a
guess would either hide a leak or invent one.

The rest of the name (``refcoco+`` in ``refcoco+_testA``) names the *benchmark* inside a task:
RefCOCO, RefCOCO+ and RefCOCOg are finetuned and evaluated separately, so an image in
RefCOCOg's train split and in RefCOCO's testA is not a leak, while one in RefCOCO+'s train and
RefCOCO+'s testA is.
"""

from __future__ import annotations

import re
from typing import Mapping

TRAIN, EVAL = "train", "eval"
ROLES = (TRAIN, EVAL)

_WORDS = re.compile(r"[_\-.+\s]+")
_TRAIN_WORD = re.compile(r"^(train|restval|trainval|nominival)\d*$", re.IGNORECASE)
# LXMERT's "nominival" (val minus minival) is trained on; its "minival" is evaluated on
_EVAL_WORD = re.compile(r"^(val|valid|validation|dev|minival|test|testa|testb|testc|testdev"
                        r"|teststd)\d*$", re.IGNORECASE)


class SplitRoleError(ValueError):
    """A ``--split-role`` value that is not ``NAME=train`` / ``NAME=eval``."""


def parse_split_roles(values: list[str] | None) -> dict[str, str]:
    """``["dev2=eval", "vqa/extra=train"]`` → ``{"dev2": "eval", "vqa/extra": "train"}``."""
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, role = value.partition("=")
        if not sep or not name or role not in ROLES:
            raise SplitRoleError(f"--split-role {value!r}: expected SPLIT=train|eval or "
                                 f"TASK/SPLIT=train|eval")
        out[name] = role
    return out


def split_role(name: str, task: str | None = None,
               overrides: Mapping[str, str] | None = None) -> str | None:
    """``"train"``, ``"eval"``, or None when the name does not say (see the module doc).
    ``overrides`` (from ``--split-role``) are looked up as ``TASK/SPLIT`` first, then
    ``SPLIT``."""
    overrides = overrides or {}
    for key in ((f"{task}/{name}",) if task else ()) + (name,):
        if key in overrides:
            return overrides[key]
    words = [w for w in _WORDS.split(name) if w]
    train = any(_TRAIN_WORD.match(w) for w in words)
    evaluation = any(_EVAL_WORD.match(w) for w in words)
    if train == evaluation:   # both kinds of word, or neither
        return None
    return TRAIN if train else EVAL


def benchmark_of(task: str, split: str) -> str:
    """The benchmark a table belongs to: the task plus the split name's words that are not
    split words (``refexp`` + ``refcoco+_testA`` → ``refexp:refcoco+``; ``vqa`` + ``val`` →
    ``vqa``). Train and evaluation tables of one benchmark must not share images."""
    # cut only at "_" and spaces: "refcoco+" and "test-dev" keep their inner punctuation
    rest = [w for w in re.split(r"[_\s]+", split) if w
            and not all(_TRAIN_WORD.match(p) or _EVAL_WORD.match(p)
                        for p in _WORDS.split(w) if p)]
    return f"{task}:{'_'.join(rest)}" if rest else task
