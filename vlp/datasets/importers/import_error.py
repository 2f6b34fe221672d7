"""The one error every importer raises for bad input: it names the file and the record."""

from __future__ import annotations

import os


class InputFormatError(ValueError):
    """An input file does not follow its public format.

    ``record`` says where in the file (``"line 12"``, ``"line 12, field 'boxes'"``,
    ``"questions[3] (question_id 42)"``), so a user can open the file and look.
    """

    def __init__(self, path: str | os.PathLike, problem: str, record: str | None = None):
        self.path, self.record, self.problem = str(path), record, problem
        where = f"{path}: {record}" if record else str(path)
        super().__init__(f"{where}: {problem}")


def line(n: int, field: str | None = None) -> str:
    """Record label for line ``n`` (1-based) of a text file, optionally one field of it."""
    return f"line {n}" + (f", field '{field}'" if field else "")
