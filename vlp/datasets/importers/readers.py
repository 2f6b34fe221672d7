"""Reading the public text formats (JSON, JSON lines, TSV) with errors that name the record."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from vlp.datasets.importers.import_error import InputFormatError, line

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
               list: "a list", dict: "an object"}


def _type_name(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def open_text(path: str | os.PathLike):
    path = Path(path)
    if not path.is_file():
        raise InputFormatError(path, "no such file")
    return open(path, encoding="utf-8", newline="")


def load_json(path: str | os.PathLike, expect: type = dict) -> Any:
    """A whole JSON document whose top level must be ``expect``."""
    with open_text(path) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise InputFormatError(path, f"not valid JSON: {e.msg}", line(e.lineno)) from None
        except UnicodeDecodeError as e:
            raise InputFormatError(path, f"not UTF-8 text: {e.reason}") from None
    if not isinstance(doc, expect):
        raise InputFormatError(path, f"top level is {_type_name(type(doc))}, expected "
                                     f"{_type_name(expect)}")
    return doc


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[str, dict]]:
    """(record label, object) for every non-blank line of a JSON-lines file."""
    with open_text(path) as f:
        n = 0
        while True:
            n += 1
            try:
                text = f.readline()
            except UnicodeDecodeError as e:
                raise InputFormatError(path, f"not UTF-8 text: {e.reason}", line(n)) from None
            if not text:
                return
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise InputFormatError(path, f"not valid JSON: {e.msg} (column {e.colno})",
                                       line(n)) from None
            if not isinstance(obj, dict):
                raise InputFormatError(path, f"a JSON-lines record must be an object, got "
                                             f"{_type_name(type(obj))}", line(n))
            yield line(n), obj


def iter_tsv(path: str | os.PathLike, num_fields: int | None, names: str
             ) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) for every non-blank line of a tab-separated file
    (``num_fields`` None: the caller checks the count).

    Split on tabs by hand rather than with ``csv``: captions contain quote characters that
    the csv module would treat as quoting, and the feature columns are huge base64 strings.
    """
    with open_text(path) as f:
        n = 0
        while True:
            n += 1
            try:
                text = f.readline()
            except UnicodeDecodeError as e:
                raise InputFormatError(path, f"not UTF-8 text: {e.reason}", line(n)) from None
            if not text:
                return
            text = text.rstrip("\r\n")
            if not text.strip():
                continue
            fields = text.split("\t")
            if num_fields is not None and len(fields) != num_fields:
                raise InputFormatError(path, f"{len(fields)} tab-separated fields, expected "
                                             f"{num_fields} ({names})", line(n))
            yield n, fields


def need(obj: dict, key: str, types: type | tuple[type, ...], path, record: str,
         nonempty: bool = True) -> Any:
    """``obj[key]`` checked for presence and type (and, for strings/lists, non-emptiness)."""
    if not isinstance(obj, dict):
        raise InputFormatError(path, f"expected an object, got {_type_name(type(obj))}", record)
    if key not in obj or obj[key] is None:
        raise InputFormatError(path, f"missing field '{key}'", record)
    value = obj[key]
    types_t = types if isinstance(types, tuple) else (types,)
    # JSON has no separate int type for floats like 3.0; but a bool is never a number here
    ok = isinstance(value, types_t) and not (isinstance(value, bool) and bool not in types_t)
    if not ok:
        raise InputFormatError(path, f"field '{key}' is {_type_name(type(value))} "
                                     f"({_short(value)}), expected {_type_name(types)}", record)
    if nonempty and isinstance(value, (str, list)) and not (value.strip() if isinstance(
            value, str) else value):
        raise InputFormatError(path, f"field '{key}' is empty", record)
    return value


def need_list(doc: dict, key: str, path) -> list:
    """A top-level list ``doc[key]`` (e.g. VQA's ``questions``)."""
    if key not in doc:
        raise InputFormatError(path, f"top-level key '{key}' is missing (keys: "
                                     f"{sorted(doc)[:8]})")
    if not isinstance(doc[key], list):
        raise InputFormatError(path, f"top-level '{key}' is {_type_name(type(doc[key]))}, "
                                     f"expected a list")
    return doc[key]


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
