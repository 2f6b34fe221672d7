"""Importers by format name: each declares its inputs, its options and a ``run`` function.

The CLI (``vlp data import FORMAT ...``) builds one sub-command per entry from these
declarations, so an importer is added by registering one ``Importer`` in its own module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

KINDS = ("features", "captions", "task")


@dataclass(frozen=True)
class Option:
    """One command-line option of an importer (argparse vocabulary)."""
    flag: str                       # "--source"
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = str
    choices: tuple | None = None
    required: bool = False
    flag_only: bool = False         # a switch (store_true)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass
class ImportReport:
    """What an import did: written files and counts, printed by the CLI, kept in the manifest."""
    importer: str
    files: list[Path] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        counts = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in self.counts.items())
        lines = [f"{self.importer}: wrote {len(self.files)} file(s)"
                 + (f" ({counts})" if counts else "")]
        lines += [f"  {p}" for p in self.files[:10]]
        if len(self.files) > 10:
            lines.append(f"  ... and {len(self.files) - 10} more")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class Importer:
    name: str                       # the FORMAT argument
    kind: str                       # features | captions | task
    summary: str                    # one line for `vlp data import --help`
    inputs: str                     # what INPUT... must be
    description: str                # the format and what the import does with it
    run: Callable[..., ImportReport]  # run(inputs, out, *, overwrite, **options)
    options: tuple[Option, ...] = ()
    min_inputs: int = 1
    max_inputs: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"importer {self.name}: kind {self.kind!r} not in {KINDS}")


IMPORTERS: dict[str, Importer] = {}


def register(importer: Importer) -> Importer:
    if importer.name in IMPORTERS:
        raise ValueError(f"importer {importer.name!r} registered twice")
    IMPORTERS[importer.name] = importer
    return importer


def get_importer(name: str) -> Importer:
    if name not in IMPORTERS:
        raise KeyError(f"unknown import format {name!r}; known: {sorted(IMPORTERS)}")
    return IMPORTERS[name]


def run_import(name: str, inputs: list, out, /, *, overwrite: bool = False,
               **options) -> ImportReport:
    """Run importer ``name`` as the CLI would; unspecified options take their defaults."""
    imp = get_importer(name)
    n = len(inputs)
    if n < imp.min_inputs or (imp.max_inputs is not None and n > imp.max_inputs):
        want = (f"{imp.min_inputs}" if imp.max_inputs == imp.min_inputs else
                f"{imp.min_inputs} to {imp.max_inputs}" if imp.max_inputs else
                f"at least {imp.min_inputs}")
        raise ValueError(f"{name} takes {want} input file(s) ({imp.inputs}), got {n}")
    known = {o.dest: o for o in imp.options}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"{name}: unknown option(s) {unknown}; known: {sorted(known)}")
    full = {d: (False if o.flag_only else o.default) for d, o in known.items()}
    full.update(options)
    missing = [known[d].flag for d, v in full.items() if known[d].required and v is None]
    if missing:
        raise ValueError(f"{name}: missing required option(s) {missing}")
    return imp.run([Path(p) for p in inputs], Path(out), overwrite=overwrite, **full)
