"""`vlp data import FORMAT INPUT... --out DIR`: public V+L formats → the vlp data folder.

One sub-command per registered importer (vlp/datasets/importers/), built from the options the
importer declares, so `vlp data import FORMAT --help` documents exactly what FORMAT takes.
"""

from __future__ import annotations

import argparse

_LAYOUT = (
    "The data folder DIR (shared with `vlp data synth`):\n"
    "  DIR/images/<source>/part-*.parquet   image shards (features, boxes, captions)\n"
    "  DIR/tasks/<task>/<split>.parquet     task tables (vqa, retrieval, nlvr2, ve, refexp, "
    "vcr)\n"
    "  DIR/manifest.json                    what was imported from where; updated last\n"
    "\n"
    "Typical order: import features (one --source per corpus), then attach captions to them, "
    "then import task tables (with --images DIR/images/<source> to check their image ids). "
    "Every import is all-or-nothing: files are built in a hidden staging folder and moved "
    "into place when complete; a malformed input stops the import with one error naming the "
    "file and the record (line number or key).\n")


def _formats_epilog() -> str:
    from vlp.datasets.importers import IMPORTERS
    lines = ["formats:"]  # indented lines: kept as written by _Formatter
    for kind, title in (("features", "region features → image shards"),
                        ("captions", "captions → attached to image shards by image id"),
                        ("task", "downstream benchmarks → task tables")):
        lines.append(f"  {title}")
        for imp in IMPORTERS.values():
            if imp.kind == kind:
                lines.append(f"    {imp.name:<20} {imp.summary}")
    return ("\n".join(lines) + "\n\n" + _LAYOUT
            + "\nRun `vlp data import FORMAT --help` for a format's inputs and options.")


def register(sub) -> None:
    from vlp.datasets.importers import IMPORTERS

    p = sub.add_parser("import", help="import public formats (BUTD TSV, UNITER npz, COCO/VG/"
                                      "CC/SBU captions, VQA, NLVR2, SNLI-VE, RefCOCO, VCR)",
                       description="Convert public V+L data files into vlp image shards and "
                                   "task tables.",
                       epilog=_formats_epilog(), formatter_class=_Formatter)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    fmt = p.add_subparsers(dest="format", metavar="FORMAT", help="one of the formats below")
    for imp in IMPORTERS.values():
        fp = fmt.add_parser(imp.name,
                            description=f"{imp.summary}.\n\nInput: {imp.inputs}.\n\n"
                                        f"{imp.description}",
                            epilog=_LAYOUT, formatter_class=_Formatter)
        fp.add_argument("inputs", nargs="+", metavar="INPUT", help=imp.inputs)
        fp.add_argument("--out", required=True, metavar="DIR",
                        help="the data folder to write into (created if missing)")
        fp.add_argument("--overwrite", action="store_true",
                        help="replace outputs that already exist (default: refuse)")
        for o in imp.options:
            help_text = o.help + ("" if o.default is None or o.flag_only
                                  else f" (default: {o.default})")
            if o.flag_only:
                fp.add_argument(o.flag, action="store_true", help=help_text)
            else:
                fp.add_argument(o.flag, type=o.type, default=o.default, choices=o.choices,
                                required=o.required, help=help_text,
                                metavar=None if o.choices else o.dest.upper())
        fp.set_defaults(func=run, importer=imp.name)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Wrap prose lines to the terminal; keep indented lines (tables, layouts) as written."""

    def _fill_text(self, text, width, indent):
        import textwrap
        return "\n".join(line if not line or line[0].isspace() else
                         textwrap.fill(line, width, initial_indent=indent,
                                       subsequent_indent=indent)
                         for line in text.split("\n"))


def run(args: argparse.Namespace) -> int:
    from vlp.datasets.importers import get_importer, run_import

    imp = get_importer(args.importer)
    options = {o.dest: getattr(args, o.dest) for o in imp.options}
    report = run_import(imp.name, args.inputs, args.out, overwrite=args.overwrite, **options)
    print(report.summary())
    return 0
