"""Typed configs: pydantic models loaded from YAML, overridden with ``--set key.sub=value``,
and validated before any compute starts.

A config is a tree of :class:`ConfigModel` s. Range limits are pydantic's (``Field(ge=...)``;
on an element type, ``Annotated[float, Field(lt=1)]``); unknown keys are errors
(``extra="forbid"``); cross-field rules live in an optional ``validate(self) ->
Iterable[(key, message)]`` method, with keys relative to that model, run by a
``model_validator`` when the config is loaded. Every problem found is reported at once, each
naming its dotted key and what was expected (``vlp.contract.config_errors``), in one
``ConfigError``; a model's cross-field rules run once its own fields and sections are valid
(so they never see a wrong type).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml
from pydantic import (BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from vlp.contract.config_errors import PROBLEMS_TYPE, ConfigError, ProblemsError, join, problems_of

__all__ = ["ConfigError", "ConfigModel", "load_config", "from_dict", "apply_overrides",
           "to_dict", "to_yaml", "redact", "flatten"]

T = TypeVar("T", bound="ConfigModel")

# MLflow refuses param values longer than this
_MAX_PARAM_LEN = 6000
_SECRET_KEY = re.compile(r"(^|[_-])(password|passwd|secret|token|api_?key|credentials?)$", re.I)
_URI_CREDENTIALS = re.compile(
    r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<pw>[^@/\s]*)@")
# validation context flag: the config is being loaded, so run the cross-field rules
_LOADING = "vlp_loading"


class ConfigModel(BaseModel):
    """A config section. Built in code (``RunSection(seed=1)``, or positionally in field
    order like the dataclasses these were) it checks types and limits, raising ``error``; its
    cross-field ``validate`` rules run when it is loaded (``load_config``/``from_dict``), or
    on every construction where ``validate_on_init`` says so, as before: a config built in
    code may be completed step by step."""

    # validate_default: a section left out of the YAML still has its cross-field rules run
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, coerce_numbers_to_str=True,
                              validate_default=True)
    error: ClassVar[type[ProblemsError]] = ConfigError
    validate_on_init: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any):
        if args:
            names = list(type(self).model_fields)
            if len(args) > len(names):
                raise TypeError(f"{type(self).__name__} takes at most {len(names)} "
                                f"positional arguments ({len(args)} given)")
            kwargs.update(zip(names, args))
        try:
            super().__init__(**kwargs)
        except ValidationError as e:
            raise self.error(problems_of(e, type(self))) from None

    # Like pydantic's RootModel: marked as the base __init__, so that validating a parent
    # builds its sections directly (with the load context) rather than through this wrapper.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def validate(self) -> Iterable[tuple[str, str]]:   # type: ignore[override]
        """Cross-field problems as ``(key relative to this model, message)``."""
        return ()

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic's lax mode reads ``true`` as 1 and 1 as ``true``: a YAML slip that
        vlp refuses, as it always did."""
        tp = cls.model_fields[info.field_name].annotation if info.field_name else None
        if tp is bool and not isinstance(value, bool):
            raise PydanticCustomError("bool_type", "expected true or false")
        if tp in (int, float) and isinstance(value, bool):
            raise PydanticCustomError(f"{tp.__name__}_type", "expected a number")
        return value

    @model_validator(mode="before")
    @classmethod
    def _empty_section(cls, data: Any) -> Any:
        return {} if data is None else data     # ``mlflow:`` with nothing under it: defaults

    @model_validator(mode="after")
    def _cross_field_rules(self, info: ValidationInfo) -> "ConfigModel":
        if not (self.validate_on_init or (info.context or {}).get(_LOADING)):
            return self
        aliases = {name: f.alias for name, f in type(self).model_fields.items() if f.alias}
        problems = []
        for key, msg in self.validate() or ():
            head, dot, rest = key.partition(".")
            problems.append((aliases.get(head, head) + dot + rest, msg))
        if problems:
            raise PydanticCustomError(PROBLEMS_TYPE, "{count} config problem(s)",
                                      {"problems": problems, "count": len(problems)})
        return self


# ---- loading ------------------------------------------------------------------------------

def load_config(cls: type[T], path: str | Path | None = None, overrides: Iterable[str] = (),
                *, data: Mapping[str, Any] | None = None) -> T:
    """Build ``cls`` from a YAML file (or a mapping), after applying ``key.sub=value``
    overrides. Raises ``ConfigError`` listing every problem (and naming the file)."""
    raw: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text) if text.strip() else {}
        if not isinstance(loaded, dict):
            raise ConfigError([("", f"expected a YAML mapping at the top level, "
                                    f"got {type(loaded).__name__}")], path)
        raw = loaded
    if data is not None:
        raw = _deep_merge(raw, dict(data))
    raw = apply_overrides(raw, overrides)
    return from_dict(cls, raw, source=path)


def from_dict(cls: type[T], raw: Any, source: str | Path | None = None) -> T:
    """Validate ``raw`` (YAML-like data) into ``cls``, cross-field rules included; raises
    ``cls.error`` naming every problem."""
    try:
        return cls.model_validate(raw, context={_LOADING: True})
    except ValidationError as e:
        raise cls.error(problems_of(e, cls), source) from None


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


# ---- output -------------------------------------------------------------------------------

def to_dict(config: Any) -> Any:
    """Plain YAML/JSON-ready containers (tuples become lists), with the keys a user writes."""
    if isinstance(config, BaseModel):
        return to_dict(config.model_dump(by_alias=True))
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
            _flatten_into(v, join(key, k), out)
        return
    if isinstance(data, list) and data and any(isinstance(v, (dict, list)) for v in data):
        for i, v in enumerate(data):
            _flatten_into(v, join(key, i), out)
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
