"""`vlp data audit DIR [--json] [--exclude-leaks --out OUT]`: leakage check, task integrity
and statistics of a data folder; optionally UNITER's exclusion of evaluation images from
pretraining."""

from __future__ import annotations

import argparse

MAX_LISTED = 20


def register(sub) -> None:
    p = sub.add_parser(
        "audit", help="check a data folder for evaluation leakage and print its statistics",
        description="Audit a data folder (a world with manifest.json, or images/<source>/ + "
                    "tasks/<task>/<split>.parquet). Evaluation images are those of every "
                    "task table whose split is an evaluation split (val, dev, test*, testA, "
                    "testB, minival, ...; train and restval are training splits) looked up in "
                    "the table's image_source (or the downstream source), plus the val/test "
                    "rows of downstream sources. Each is searched by image_id, region-feature "
                    "hash and decoded-pixel hash in the pretraining sources (any task's "
                    "evaluation image: one checkpoint is finetuned on all of them), in the "
                    "training tables of its own benchmark, and in the other evaluation split. "
                    "Prints counts per source and table, tokens per caption, regions per "
                    "image and the detector class histogram. Exit status 1 when anything "
                    "leaks or a table is broken (with --exclude-leaks: when anything but "
                    "the excluded pretraining leaks remains).")
    p.add_argument("folder", metavar="DIR", help="the data folder to audit")
    p.add_argument("--json", action="store_true",
                   help="print the full report as JSON instead of a table")
    p.add_argument("--pretrain-split", default="train",
                   choices=["train", "val", "test", "all"],
                   help="the image split pretraining reads (the pipeline's data.split, "
                        "default train); 'all' when it reads every row")
    p.add_argument("--split-role", action="append", metavar="[TASK/]SPLIT=train|eval",
                   help="the role of a table split the naming rules do not cover (repeatable)"
                        ", e.g. --split-role vqa/extra=train")
    p.add_argument("--exclude-leaks", action="store_true",
                   help="UNITER A.1: write --out, a copy of DIR whose pretraining sources hold "
                        "no evaluation image: a leaking row a task table names loses its "
                        "captions (pretraining reads image-caption pairs; the task keeps its "
                        "features), any other leaking row is removed; everything else is "
                        "hard-linked. Lists what was excluded per source in "
                        "OUT/meta/leak_exclusion.json")
    p.add_argument("--out", metavar="OUT",
                   help="with --exclude-leaks: the folder to write (DIR itself replaces DIR "
                        "in one rename)")
    p.add_argument("--overwrite", action="store_true",
                   help="with --exclude-leaks: replace OUT if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from vlp.datasets.audit.leakage import PRETRAINING, audit_world
    from vlp.datasets.audit.splits import SplitRoleError, parse_split_roles

    if args.exclude_leaks != bool(args.out):
        print("vlp data audit: error: --exclude-leaks and --out go together", file=sys.stderr)
        return 2
    try:
        roles = parse_split_roles(args.split_role)
    except SplitRoleError as e:
        print(f"vlp data audit: error: {e}", file=sys.stderr)
        return 2
    report = audit_world(args.folder, pretrain_split=args.pretrain_split, split_roles=roles)
    exclusion = None
    if args.exclude_leaks:
        from vlp.datasets.audit.exclude import exclude_leaks
        try:
            exclusion = exclude_leaks(args.folder, report, args.out, overwrite=args.overwrite)
        except (FileExistsError, ValueError) as e:
            print(f"vlp data audit: error: {e}", file=sys.stderr)
            return 2
    if args.json:
        out = report.to_json()
        if exclusion is not None:
            out["exclusion"] = exclusion.to_json()
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(format_report(report))
        if exclusion is not None:
            print(format_exclusion(exclusion))
    if exclusion is not None:
        remaining = [l for l in report.leaks if l.kind != PRETRAINING]
        return 0 if not remaining and not report.problems else 1
    return 0 if report.ok else 1


def format_report(report) -> str:
    from tabulate import tabulate

    rows = [(name, s["domain"], s["images"], s["pairs"],
             s["tokens_per_caption"].get("mean", "-"), s["regions_per_image"].get("mean", "-"),
             " ".join(f"{k}={v}" for k, v in s["splits"].items()))
            for name, s in report.sources.items()]
    out = [f"audit of {report.root}", "",
           tabulate(rows, headers=["source", "domain", "images", "pairs", "tokens/caption",
                                   "regions/image", "splits"]), ""]
    trows = [(task, split, t["role"] or "?", t["image_source"] or "(downstream)",
              t["context"] or "-", t["rows"], t["images"])
             for task, by in report.tasks.items() for split, t in by.items()]
    if trows:
        out += [tabulate(trows, headers=["task", "split", "role", "images of", "benchmark",
                                         "rows", "images"]), ""]
    st = report.stats
    hist = st.get("class_histogram", {})
    total = sum(hist.values()) or 1
    out.append(f"{st['images']} images ({st['pretraining_images']} pretraining, "
               f"{st['evaluation_images']} evaluation), {st['pairs']} pairs; tokens/caption "
               f"({st['tokenizer']}) {st['tokens_per_caption']}; regions/image "
               f"{st['regions_per_image']}")
    if hist:
        out.append("detector classes (argmax): " + ", ".join(
            f"{k} {100 * v / total:.1f}%"
            for k, v in sorted(hist.items(), key=lambda kv: -kv[1])))
    out.append("")
    if report.leaks:
        from collections import Counter
        kinds = Counter(l.kind for l in report.leaks)
        out.append(f"LEAKAGE: {len(report.leaks)} evaluation image match(es) ("
                   + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")")
        out += ["  " + leak.line() for leak in report.leaks[:MAX_LISTED]]
        if len(report.leaks) > MAX_LISTED:
            out.append(f"  ... and {len(report.leaks) - MAX_LISTED} more (see --json)")
    for problem in report.problems:
        out.append(f"PROBLEM: {problem}")
    for warning in report.warnings:
        out.append(f"warning: {warning}")
    if report.ok:
        out.append("no leakage: no evaluation image appears in pretraining, in its "
                   "benchmark's training data or in another evaluation split")
    return "\n".join(out)


def format_exclusion(exclusion) -> str:
    from tabulate import tabulate

    rows = [(source, c["images_before"], c["images_removed"], c["images_uncaptioned"],
             c["pairs_removed"]) for source, c in sorted(exclusion.counts.items())]
    out = ["", f"excluded evaluation images from pretraining → {exclusion.out}",
           tabulate(rows, headers=["source", "images before", "images removed",
                                   "uncaptioned (a task table needs them)",
                                   "pairs removed"])]
    if exclusion.files_rewritten:
        out.append(f"rewrote {len(exclusion.files_rewritten)} shard(s); every other file is "
                   f"hard-linked from the audited folder")
    if exclusion.files_dropped:
        out.append(f"dropped {len(exclusion.files_dropped)} shard(s) whose every row leaked: "
                   f"{exclusion.files_dropped}")
    out.append(f"removed images: {exclusion.out}/meta/leak_exclusion.json")
    return "\n".join(out)
