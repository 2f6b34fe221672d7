"""vlp's one-line config errors, rendered from pydantic's.

pydantic reports each problem as a type (``missing``, ``literal_error``, ``greater_than``...),
a location and the input; vlp users read ``optimizer.betas.1: expected a number ≥ 0 and < 1,
got 1.5``. ``problems_of`` turns one into the other: the dotted key, what the field expects
(read from the model's annotations, so that a message names every limit of the field, not only
the one broken), what was given, and for an unknown key or a misspelt choice the nearest known
name.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import annotated_types
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

# a model's cross-field rules report their (key, message) list under this pydantic error type
PROBLEMS_TYPE = "vlp_problems"

_LIMITS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))
_LIMIT_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal",
                 "finite_number"}


class ProblemsError(ValueError):
    """One or more problems, each ``(dotted key, what was expected)``, on one line each."""

    title = "invalid"

    def __init__(self, problems: Sequence[tuple[str, str]], source: str | Path | None = None):
        self.problems = list(problems)
        self.source = str(source) if source is not None else None
        head = f"{self.title} ({self.source})" if self.source else self.title
        lines = [f"{key or '<root>'}: {msg}" for key, msg in self.problems]
        if len(lines) == 1:
            super().__init__(f"{head}: {lines[0]}")
        else:
            super().__init__(f"{head}:\n  " + "\n  ".join(lines))

    def __reduce__(self):   # picklable across Ray workers, like any exception with state
        return type(self), (self.problems, self.source)


class ConfigError(ProblemsError):
    """One or more config problems, each ``(dotted key, what was expected)``."""

    title = "invalid config"


def suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def problems_of(error: ValidationError, model: type[BaseModel]) -> list[tuple[str, str]]:
    """Every problem of a failed ``model`` validation as ``(dotted key, message)``."""
    out: list[tuple[str, str]] = []
    for e in error.errors(include_url=False):
        loc = e["loc"]
        key = ".".join(str(p) for p in loc)
        kind = e["type"]
        if kind == PROBLEMS_TYPE:
            out += [(join(key, sub), msg) for sub, msg in e["ctx"]["problems"]]
        elif kind == "extra_forbidden":
            known = _field_keys(_type_at(model, loc[:-1])[0])
            out.append((key, f"unknown key (known: {', '.join(known)})"
                             + suggest(str(loc[-1]), known)))
        elif kind in ("value_error", "assertion_error"):
            out.append((key, str(e["ctx"]["error"])))
        else:
            out.append((key, _message(kind, e.get("input"), *_type_at(model, loc))))
    return out


def _message(kind: str, value: Any, tp: Any, limits: dict[str, float]) -> str:
    if kind == "missing":
        return f"required: {describe(tp)}"
    if kind in _LIMIT_ERRORS:
        what = describe(tp) if tp is int else "a finite number"
        return f"expected {what} {range_text(limits)}".rstrip() + f", got {value!r}"
    hint = suggest(value, [str(a) for a in typing.get_args(tp)]) \
        if kind == "literal_error" and isinstance(value, str) else ""
    return f"expected {describe(tp)}, got {_got(value)}{hint}"


# ---- what a location expects --------------------------------------------------------------

def _type_at(model: type[BaseModel], loc: Sequence[Any]) -> tuple[Any, dict[str, float]]:
    """The annotation at ``loc`` inside ``model`` and its numeric limits (``None`` when the
    location is not a field, e.g. under an unknown key)."""
    tp, meta = model, []
    for part in loc:
        tp, meta = _unwrap(tp, meta, optional=True)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if _is_model(tp):
            name = _field_keys(tp).get(part)
            if name is None:
                return None, {}
            field = tp.model_fields[name]
            tp, meta = field.annotation, list(field.metadata)
        elif origin in (dict, Mapping):
            tp, meta = args[1], []
        elif origin in (list, Sequence) or (origin is tuple and args[-1:] == (Ellipsis,)):
            tp, meta = args[0], []
        elif origin is tuple and isinstance(part, int) and part < len(args):
            tp, meta = args[part], []
        else:
            return None, {}
    tp, meta = _unwrap(tp, meta, optional=False)
    return tp, _limits(meta)


def _unwrap(tp: Any, meta: list, optional: bool) -> tuple[Any, list]:
    while True:
        if typing.get_origin(tp) is Annotated:
            meta = meta + list(tp.__metadata__)
            tp = typing.get_args(tp)[0]
        elif optional and _is_union(tp):
            non_none = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(non_none) != 1:
                return tp, meta
            tp = non_none[0]
        else:
            return tp, meta


def _limits(meta: Iterable[Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in meta:
        if isinstance(m, FieldInfo):
            out.update(_limits(m.metadata))
        elif isinstance(m, annotated_types.Interval):
            out.update({k: getattr(m, k) for k, _ in _LIMITS if getattr(m, k) is not None})
        else:
            for k, _ in _LIMITS:
                if isinstance(m, getattr(annotated_types, k.capitalize())):
                    out[k] = getattr(m, k)
    return out


def _field_keys(model: Any) -> dict[str, str]:
    """The keys a user writes for ``model`` (aliases where set) → field names."""
    if not _is_model(model):
        return {}
    return {f.alias or name: name for name, f in model.model_fields.items()}


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def range_text(limits: Mapping[str, float]) -> str:
    return " and ".join(f"{sym} {limits[k]}" for k, sym in _LIMITS if k in limits)


def describe(tp: Any) -> str:
    """What a value of annotation ``tp`` looks like in YAML, in words."""
    tp, _ = _unwrap(tp, [], optional=False)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    simple = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
              type(None): "null"}
    if tp in simple:
        return simple[tp]
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if _is_union(tp):
        return " or ".join(describe(a) for a in args)
    if origin in (list, Sequence) or (origin is tuple and args[-1:] == (Ellipsis,)):
        return f"a list of {_plural(args[0])}"
    if origin is tuple:
        return f"a list of {len(args)} items ({', '.join(describe(a) for a in args)})"
    if origin in (dict, Mapping):
        return f"a mapping of names to {_plural(args[1])}"
    if _is_model(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _plural(tp: Any) -> str:
    d = describe(tp)
    for article in ("an ", "a "):
        if d.startswith(article):
            return d[len(article):] + "s"
    return d


def _got(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"
