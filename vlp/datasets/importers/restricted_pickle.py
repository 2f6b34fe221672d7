"""Load a pickle that may hold only plain containers — never code.

A pickle can name any importable callable and call it while loading; a downloaded refs file
could therefore run anything. This loader refuses every opcode that looks up a global or a
persistent id (``find_class`` / ``persistent_load`` raise before anything is built), so a
refused file executes nothing, and then checks that what was built is made only of dict,
list, tuple, str, int, float, bool and None (pickle can build sets and bytes without a
global; those are refused too).
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

from vlp.datasets.importers.import_error import InputFormatError

PLAIN_TYPES = (dict, list, tuple, str, int, float, bool, type(None))


class _Refused(Exception):
    pass


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise _Refused(f"it refers to the global {module}.{name}")

    def persistent_load(self, pid):
        raise _Refused("it uses a persistent id")


def _check_plain(obj: Any) -> str | None:
    """Where the first non-plain object sits (``[3]['sentences']``), or None."""
    stack, seen = [(obj, "")], set()
    while stack:
        o, where = stack.pop()
        if type(o) not in PLAIN_TYPES:
            return f"{where or 'the top level'} is a {type(o).__name__}"
        if isinstance(o, (dict, list, tuple)):
            if id(o) in seen:
                continue
            seen.add(id(o))
            if isinstance(o, dict):
                for k, v in o.items():
                    if type(k) not in PLAIN_TYPES:
                        return f"a key of {where or 'the top level'} is a {type(k).__name__}"
                    stack.append((v, f"{where}[{k!r}]"))
            else:
                stack.extend((v, f"{where}[{i}]") for i, v in enumerate(o))
    return None


def load_plain_pickle(path: str | os.PathLike) -> Any:
    """Unpickle ``path`` if it holds only plain containers; otherwise InputFormatError.

    Python 2 pickles (the RefCOCO refs files) store text as byte strings: they are decoded
    as UTF-8, which also reads their ASCII.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFormatError(path, "no such file")
    data = path.read_bytes()
    try:
        obj = _PlainUnpickler(io.BytesIO(data), encoding="utf-8").load()
    except _Refused as e:
        raise InputFormatError(path, f"refused: {e}; only plain containers (dict, list, tuple, "
                                     f"str, int, float, bool, None) are accepted") from None
    except (pickle.UnpicklingError, EOFError, UnicodeDecodeError, ValueError, TypeError,
            IndexError, KeyError, AttributeError, MemoryError) as e:
        raise InputFormatError(path, f"not a readable pickle ({type(e).__name__}: {e})") from None
    bad = _check_plain(obj)
    if bad:
        raise InputFormatError(path, f"refused: {bad}; only plain containers (dict, list, "
                                     f"tuple, str, int, float, bool, None) are accepted")
    return obj
