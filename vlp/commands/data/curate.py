"""`vlp data curate IN_DIR --source NAME --out OUT_DIR [...]`: ImageBERT-style curation of
web image–text pairs (image size, caption cleaning, length and vocabulary rules, duplicate
texts, the ITM score of a vlp model, best text per picture) into curated shards + a report."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    from vlp.platform.curation.curation_config import CurationConfig
    d = CurationConfig()
    p = sub.add_parser(
        "curate", help="filter web image-text pairs (ImageBERT §3) into curated shards",
        description="Curate the pairs of one source of a data folder, ImageBERT §3 style. "
                    "Filters, in order: image_size (shorter side, aspect ratio), clean (HTML, "
                    "URLs, whitespace; empty captions dropped), length (words), vocabulary "
                    "(share of words that are [UNK] or split into many WordPiece pieces), "
                    "text_frequency (one text on too many images), itm (P(match) of a vlp "
                    "model's ITM head, with --checkpoint), aggregate (the best scored texts "
                    "of one picture). Writes OUT/images/NAME/ (atomically), "
                    "OUT/meta/curation/NAME.json (pairs removed per filter) and "
                    "NAME.removed.parquet (every removed pair), and the source's manifest "
                    "entry.")
    p.add_argument("folder", metavar="IN_DIR", help="data folder holding the source")
    p.add_argument("--source", required=True, help="the source to curate (e.g. cc)")
    p.add_argument("--out", required=True, metavar="OUT_DIR",
                   help="data folder to write the curated source into (may be IN_DIR)")
    p.add_argument("--as", dest="out_source", metavar="NAME",
                   help="name of the curated source in OUT_DIR (default: --source)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUT_DIR/images/NAME if it exists")
    p.add_argument("--filters", metavar="A,B", help="run only these filters (comma-separated)")
    p.add_argument("--skip", metavar="A,B", help="do not run these filters")
    g = p.add_argument_group("thresholds")
    g.add_argument("--min-side", type=int, default=d.min_side,
                   help=f"shorter image side in pixels, 0 = off (ImageBERT: 300; default "
                        f"{d.min_side})")
    g.add_argument("--max-aspect-ratio", type=float, default=d.max_aspect_ratio,
                   help=f"longer/shorter side, 0 = off (default {d.max_aspect_ratio})")
    g.add_argument("--min-words", type=int, default=d.min_words,
                   help=f"default {d.min_words}")
    g.add_argument("--max-words", type=int, default=d.max_words,
                   help=f"0 = off (default {d.max_words})")
    g.add_argument("--oov-min-pieces", type=int, default=d.oov_min_pieces,
                   help=f"a word of this many WordPiece pieces counts as out of vocabulary "
                        f"(default {d.oov_min_pieces})")
    g.add_argument("--max-oov-ratio", type=float, default=d.max_oov_ratio,
                   help=f"largest share of out-of-vocabulary words, 1 = off (default "
                        f"{d.max_oov_ratio})")
    g.add_argument("--max-images-per-text", type=int, default=d.max_images_per_text,
                   help=f"drop a text found on more distinct images, 0 = off (default "
                        f"{d.max_images_per_text})")
    g.add_argument("--max-texts-per-image", type=int, default=d.max_texts_per_image,
                   help=f"keep this many best scored texts per picture, 0 = off (default "
                        f"{d.max_texts_per_image})")
    m = p.add_argument_group("semantic filter")
    m.add_argument("--checkpoint", metavar="PATH",
                   help="model weights (our layout or UNITER's) or a vlp pretraining "
                        "checkpoint folder; its ITM head scores every pair")
    m.add_argument("--family", help="model family of the checkpoint when no vlp_model.json "
                                    "beside it says (e.g. uniter-base)")
    m.add_argument("--tokenizer", metavar="PATH",
                   help="the checkpoint's WordPiece vocabulary (folder with tokenizer.json or "
                        "vocab.txt) when it is not the packaged uncased one")
    m.add_argument("--min-itm-score", type=float,
                   help="drop pairs whose P(match) is below this (needs --checkpoint)")
    m.add_argument("--itm-batch-size", type=int, default=d.itm_batch_size)
    m.add_argument("--device", default="cpu", help="torch device for scoring (default cpu)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from vlp.platform.curation import FILTERS, CurationConfig, CurationConfigError, curate_source
    from vlp.platform.curation.itm_checkpoint import ItmCheckpointError
    from vlp.datasets.storage.world import WorldError, load_manifest

    def fail(message: str) -> int:
        print(f"vlp data curate: error: {message}", file=sys.stderr)
        return 2

    try:
        cfg = CurationConfig(
            min_side=args.min_side, max_aspect_ratio=args.max_aspect_ratio,
            min_words=args.min_words, max_words=args.max_words,
            oov_min_pieces=args.oov_min_pieces, max_oov_ratio=args.max_oov_ratio,
            max_images_per_text=args.max_images_per_text,
            max_texts_per_image=args.max_texts_per_image, min_itm_score=args.min_itm_score,
            itm_batch_size=args.itm_batch_size)
    except CurationConfigError as e:
        return fail(str(e))
    if args.min_itm_score is not None and not args.checkpoint:
        return fail("--min-itm-score needs --checkpoint (the model that scores the pairs)")
    names = list(FILTERS)
    try:
        if args.filters:
            names = [n.strip() for n in args.filters.split(",") if n.strip()]
        if args.skip:
            skip = {n.strip() for n in args.skip.split(",") if n.strip()}
            unknown = skip - set(FILTERS)
            if unknown:
                raise ValueError(f"unknown curation filter(s) {sorted(unknown)}; known: "
                                 f"{', '.join(FILTERS)}")
            names = [n for n in names if n not in skip]
        scorer, itm_info = None, None
        if args.checkpoint:
            scorer, itm_info = _scorer(args, load_manifest(args.folder))
        result = curate_source(args.folder, args.source, args.out, cfg,
                               out_source=args.out_source, scorer=scorer, filters=names,
                               overwrite=args.overwrite, itm_info=itm_info)
    except (WorldError, FileExistsError, ValueError, ItmCheckpointError) as e:
        return fail(str(e))
    if args.json:
        print(json.dumps(result.report.to_json(), indent=2, sort_keys=True))
    else:
        print(format_report(result.report))
    return 0


def _scorer(args, world):
    from vlp.platform.curation.itm_checkpoint import load_scoring_model
    from vlp.platform.curation.itm_scorer import ItmScorer

    scoring = load_scoring_model(args.checkpoint, region_feat_dim=world.feature_dim,
                                 num_classes=world.num_classes, family=args.family,
                                 device=args.device)
    scorer = ItmScorer(scoring, batch_size=args.itm_batch_size,
                       feature_dim=world.feature_dim, num_classes=world.num_classes,
                       device=args.device, tokenizer_path=args.tokenizer)
    return scorer, {"checkpoint": scoring.source, "family": scoring.preprocess.family,
                    "load": scoring.summary}


def format_report(report) -> str:
    from tabulate import tabulate

    rows, left = [], report.pairs_in
    for name, n in report.removed.items():
        left -= n
        rows.append((name, n, f"{100 * n / max(report.pairs_in, 1):.1f}%", left))
    out = [f"curated {report.source} → {report.out}/images/{report.out_source}",
           tabulate(rows, headers=["filter", "pairs removed", "of input", "pairs left"]),
           f"pairs {report.pairs_in} → {report.pairs_out}; captioned images "
           f"{report.images_in} → {report.images_out}"
           + (f"; {report.uncaptioned_passed_through} images without captions passed through"
              if report.uncaptioned_passed_through else "")]
    if report.itm:
        out.append(f"ITM scores from {report.itm['checkpoint']} ({report.itm['family']}): "
                   f"{report.itm['scored_pairs']} pairs scored, mean P(match) "
                   f"{report.itm['mean_score']}")
    out.append(f"report: {report.out}/meta/curation/{report.out_source}.json "
               f"(removed pairs: {report.out_source}.removed.parquet)")
    return "\n".join(out)
