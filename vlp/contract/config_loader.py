"""Typed configs: dataclasses loaded from YAML, overridden with ``--set key.sub=value``, and
validated before any compute starts.

A config is a tree of dataclasses. Leaves are ``int``, ``float``, ``str``, ``bool``,
``Literal[...]``, ``Optional[...]``, ``list[...]``, ``tuple[...]`` and ``dict[str, ...]``.
Range limits live in the field metadata (``bounded(...)``); cross-field rules live in an
optional ``validate(self) -> Iterable[(key, message)]`` method on any dataclass in the tree,
with keys relative to that dataclass. Every problem found is reported at once, each naming its
dotted key and what was expected, in one ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

T = TypeVar("T")

# MLflow refuses param values longer than this
_MAX_PARAM_LEN = 6000
_SECRET_KEY = re.compile(r"(^|[_-])(password|passwd|secret|token|api_?key|credentials?)$", re.I)
_URI_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<pw>[^@/\s]*)@")


class ConfigError(ValueError):
    """One or more config problems, each ``(dotted key, what was expected)``."""

    def __init__(self, problems: Sequence[tuple[str, str]]):
        self.problems = list(problems)
        lines = [f"{key or '<root>'}: {msg}" for key, msg in self.problems]
        if len(lines) == 1:
            super().__init__(f"invalid config: {lines[0]}")
        else:
            super().__init__("invalid config:\n  " + "\n  ".join(lines))


def bounded(default: Any = dataclasses.MISSING, *, ge: float | None = None,
            gt: float | None = None, le: float | None = None, lt: float | None = None,
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with numeric limits, checked on load (applies to each element of a
    list/tuple field too)."""
    limits = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"limits": limits})


# ---- loading ------------------------------------------------------------------------------

def load_config(cls: type[T], path: str | Path | None = None, overrides: Iterable[str] = (),
                *, data: Mapping[str, Any] | None = None) -> T:
    """Build ``cls`` from a YAML file (or a mapping), after applying ``key.sub=value``
    overrides. Raises ``ConfigError`` listing every problem."""
    raw: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text) if text.strip() else {}
        if not isinstance(loaded, dict):
            raise ConfigError([("", f"{path}: expected a YAML mapping at the top level, "
                                    f"got {type(loaded).__name__}")])
        raw = loaded
    if data is not None:
        raw = _deep_merge(raw, dict(data))
    raw = apply_overrides(raw, overrides)
    return from_dict(cls, raw)


def from_dict(cls: type[T], raw: Mapping[str, Any]) -> T:
    problems: list[tuple[str, str]] = []
    value = _convert(cls, raw, "", problems)
    if problems:
        raise ConfigError(problems)
    _run_validators(value, "", problems)
    if problems:
        raise ConfigError(problems)
    return value


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings; the value is parsed as YAML (``1e-4``, ``[0.9, 0.98]``,
    ``true``, ``{mlm: 1}``). A numeric path part indexes into a list."""
    out = _deep_copy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError([(item, "an override must look like key.sub=value")])
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError([(key, f"could not parse override value {text!r} as YAML: {e}")])
        parts = key.split(".")
        node: Any = out
        for i, part in enumerate(parts[:-1]):
            node = _child(node, part, ".".join(parts[:i + 1]), create=True)
        last = parts[-1]
        if isinstance(node, list):
            idx = _list_index(node, last, key)
            node[idx] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError([(key, f"cannot set a sub-key of a {type(node).__name__} value")])
    return out


def _child(node: Any, part: str, key: str, create: bool) -> Any:
    if isinstance(node, list):
        return node[_list_index(node, part, key)]
    if not isinstance(node, dict):
        raise ConfigError([(key, f"cannot set a sub-key of a {type(node).__name__} value")])
    if part not in node or node[part] is None:
        node[part] = {}
    return node[part]


def _list_index(node: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError([(key, f"expected a list index below {len(node)}, got {part!r}")])
    return int(part)


def _deep_copy(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _deep_copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_deep_copy(v) for v in x]
    return x


def _deep_merge(a: dict, b: dict) -> dict:
    out = _deep_copy(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) \
            else _deep_copy(v)
    return out


# ---- conversion + type checks -------------------------------------------------------------

def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is bool:
        return "true or false"
    if tp is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin in (list, Sequence):
        return f"a list of {_plural(args[0])}"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(args[0])}"
        return f"a list of {len(args)} items ({', '.join(_describe(a) for a in args)})"
    if origin in (dict, Mapping):
        return f"a mapping of names to {_plural(args[1])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _plural(tp: Any) -> str:
    d = _describe(tp)
    for article in ("an ", "a "):
        if d.startswith(article):
            return d[len(article):] + "s"
    return d


def _got(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _convert(tp: Any, value: Any, key: str, problems: list[tuple[str, str]]) -> Any:
    """Return ``value`` converted to ``tp``; on a mismatch, record a problem and return it as
    is (checking goes on so that every problem is reported)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, value, key, problems)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _convert(non_none[0], value, key, problems)
        for a in non_none:  # first alternative that fits cleanly
            trial: list[tuple[str, str]] = []
            out = _convert(a, value, key, trial)
            if not trial:
                return out
        problems.append((key, f"expected {_describe(tp)}, got {_got(value)}"))
        return value
    if origin is Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
        hint = _suggest(value, [str(a) for a in args]) if isinstance(value, str) else ""
        problems.append((key, f"expected {_describe(tp)}, got {_got(value)}{hint}"))
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        problems.append((key, f"expected true or false, got {_got(value)}"))
        return value
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        problems.append((key, f"expected an integer, got {_got(value)}"))
        return value
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 5e-5 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        problems.append((key, f"expected a number, got {_got(value)}"))
        return value
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        problems.append((key, f"expected a string, got {_got(value)}"))
        return value
    if origin in (list, Sequence) or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        if not isinstance(value, (list, tuple)):
            problems.append((key, f"expected {_describe(tp)}, got {_got(value)}"))
            return value
        items = [_convert(args[0], v, _join(key, i), problems) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            problems.append((key, f"expected {_describe(tp)}, got {_got(value)}"))
            return value
        return tuple(_convert(a, v, _join(key, i), problems)
                     for i, (a, v) in enumerate(zip(args, value)))
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            problems.append((key, f"expected {_describe(tp)}, got {_got(value)}"))
            return value
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                problems.append((_join(key, k), f"expected a string name, got {_got(k)}"))
                continue
            out[k] = _convert(args[1], v, _join(key, k), problems)
        return out
    if tp is Any:
        return value
    raise TypeError(f"config type {tp!r} at {key!r} is not supported by config_loader")


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _convert_dataclass(cls: type, value: Any, key: str, problems: list[tuple[str, str]]) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        problems.append((key, f"expected a mapping, got {_got(value)}"))
        return value
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for k in value:
        if k not in fields:
            where = f"unknown key (known: {', '.join(fields)})"
            problems.append((_join(key, k), where + _suggest(str(k), fields)))
    kwargs = {}
    for name, f in fields.items():
        sub = _join(key, name)
        if name in value:
            converted = _convert(hints[name], value[name], sub, problems)
            _check_limits(f, converted, sub, problems)
            kwargs[name] = converted
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            problems.append((sub, f"required: {_describe(hints[name])}"))
    try:
        return cls(**kwargs)
    except (TypeError, ValueError):  # already reported as problems above
        return None


def _check_limits(f: dataclasses.Field, value: Any, key: str, problems: list) -> None:
    limits = f.metadata.get("limits")
    if not limits:
        return
    items = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
    for i, v in items:
        k = key if i is None else _join(key, i)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue  # the type problem is already reported
        bad = (not math.isfinite(v)
               or ("ge" in limits and not v >= limits["ge"])
               or ("gt" in limits and not v > limits["gt"])
               or ("le" in limits and not v <= limits["le"])
               or ("lt" in limits and not v < limits["lt"]))
        if bad:
            problems.append((k, f"expected a finite number {_range_text(limits)}, got {v!r}"))


def _range_text(limits: dict) -> str:
    parts = [f"{sym} {limits[k]}" for k, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"),
                                                  ("lt", "<")) if k in limits]
    return " and ".join(parts)


def _run_validators(obj: Any, key: str, problems: list[tuple[str, str]]) -> None:
    """Depth-first: children first, so that a parent's cross-field rules see valid parts."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _run_validators(getattr(obj, f.name), _join(key, f.name), problems)
        validate = getattr(obj, "validate", None)
        if callable(validate):
            for sub, msg in validate() or ():
                problems.append((_join(key, sub), msg))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _run_validators(v, _join(key, k), problems)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _run_validators(v, _join(key, i), problems)


# ---- output -------------------------------------------------------------------------------

def to_dict(config: Any) -> Any:
    """Plain YAML/JSON-ready containers (tuples become lists)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, dict):
        return {k: to_dict(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [to_dict(v) for v in config]
    return config


def to_yaml(config: Any) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False, default_flow_style=None)


def redact(text: str) -> str:
    """Hide the password in any ``scheme://user:password@host`` inside ``text``."""
    return _URI_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def flatten(config: Any, prefix: str = "") -> dict[str, str]:
    """``{"optimizer.lr": "5e-05", "tasks.mlm": "2.0", "optimizer.betas": "[0.9, 0.98]", ...}``
    for MLflow params. Secrets never pass: keys that name one are masked and passwords inside
    URIs are redacted."""
    out: dict[str, str] = {}
    data = to_dict(config)
    _flatten_into(data, prefix, out)
    return out


def _flatten_into(data: Any, key: str, out: dict[str, str]) -> None:
    if isinstance(data, dict) and data:
        for k, v in data.items():
            _flatten_into(v, _join(key, k), out)
        return
    if isinstance(data, list) and data and any(isinstance(v, (dict, list)) for v in data):
        for i, v in enumerate(data):
            _flatten_into(v, _join(key, i), out)
        return
    if isinstance(data, (list, dict)):
        text = json.dumps(data)
    elif data is None:
        text = "null"
    else:
        text = str(data)
    last = key.rsplit(".", 1)[-1]
    if _SECRET_KEY.search(last) and text not in ("", "null"):
        text = "***"
    out[key] = redact(text)[:_MAX_PARAM_LEN]
