"""`vlp data audit DIR [--json]`: leakage check, task integrity and statistics of a world."""

from __future__ import annotations

import argparse

MAX_LISTED = 20


def register(sub) -> None:
    p = sub.add_parser(
        "audit", help="check a world for evaluation leakage and print its statistics",
        description="Audit a data folder (a world with manifest.json, or images/<source>/ + "
                    "tasks/<task>/<split>.parquet): every downstream val/test image is "
                    "looked up in all pretraining shards and the downstream train split by "
                    "image_id, by region-feature hash and by decoded-pixel hash; task tables "
                    "must reference images of their own split. Prints counts per source and "
                    "task, tokens per caption, regions per image and the detector class "
                    "histogram. Exit status 1 when anything leaks or a table is broken.")
    p.add_argument("folder", metavar="DIR", help="the world folder to audit")
    p.add_argument("--json", action="store_true",
                   help="print the full report as JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from vlp.datasets.audit import audit_world

    report = audit_world(args.folder)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print(format_report(report))
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
    trows = [(task, *(f"{by.get(sp, {}).get('rows', '-')} / {by.get(sp, {}).get('images', '-')}"
                      for sp in ("train", "val", "test")))
             for task, by in report.tasks.items()]
    if trows:
        out += [tabulate(trows, headers=["task", "train rows/images", "val", "test"]), ""]
    st = report.stats
    hist = st.get("class_histogram", {})
    total = sum(hist.values()) or 1
    out.append(f"{st['images']} images ({st['pretraining_images']} pretraining), "
               f"{st['pairs']} pairs; tokens/caption ({st['tokenizer']}) "
               f"{st['tokens_per_caption']}; regions/image {st['regions_per_image']}")
    out.append("detector classes (argmax): " + ", ".join(
        f"{k} {100 * v / total:.1f}%" for k, v in sorted(hist.items(), key=lambda kv: -kv[1])))
    out.append("")
    if report.leaks:
        out.append(f"LEAKAGE: {len(report.leaks)} evaluation image match(es)")
        out += ["  " + leak.line() for leak in report.leaks[:MAX_LISTED]]
        if len(report.leaks) > MAX_LISTED:
            out.append(f"  ... and {len(report.leaks) - MAX_LISTED} more (see --json)")
    for problem in report.problems:
        out.append(f"PROBLEM: {problem}")
    for warning in report.warnings:
        out.append(f"warning: {warning}")
    if report.ok:
        out.append("no leakage: no val/test image appears in pretraining or downstream train")
    return "\n".join(out)
