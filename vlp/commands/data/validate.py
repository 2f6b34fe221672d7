"""`vlp data validate PATH...`: check shards and task tables against the format."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("validate", help="validate image shards and task tables",
                       description="Read every Parquet file under the given files/folders and "
                                   "check it against the vlp shard format. Exit 1 on the first "
                                   "violation, with a message naming the file, row and field.")
    p.add_argument("paths", nargs="+", help="shard files or folders (searched recursively)")
    p.add_argument("--no-values", action="store_true",
                   help="skip the value checks (NaN/Inf, boxes inside the image): faster")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vlp.datasets.storage.shards import list_shards, read_image_shard, shard_info
    from vlp.datasets.storage.task_tables import read_task_table

    files: list[Path] = []
    for p in map(Path, args.paths):
        files.extend(list_shards(p) if p.is_dir() else [p])
    rows = 0
    for f in files:
        kind = shard_info(f).kind
        if kind == "images":
            table, _ = read_image_shard(f, check_values=not args.no_values)
        else:
            table, _ = read_task_table(f)
        rows += table.num_rows
    print(f"ok: {len(files)} files, {rows} rows")
    return 0
