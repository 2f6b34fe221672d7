"""Visual Genome region descriptions (``region_descriptions.json``) as image captions.

Format: ``[{"id": image_id, "regions": [{"region_id", "image_id", "phrase", "x", "y",
"width", "height"}]}]`` (some releases name the image key ``image_id``). Every region phrase
becomes a caption of its whole image, as UNITER uses VG for pretraining; repeated phrases of
one image are kept once. Blank phrases occur in the release: they are skipped and counted.
"""

from __future__ import annotations

from pathlib import Path

from vlp.datasets.importers.caption_merge import ALLOW_MISSING, FEATURES, Captions, merge_captions
from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.image_ids import canonical_image_id
from vlp.datasets.importers.readers import load_json, need
from vlp.datasets.importers.registry import Importer, ImportReport, Option, register


def run(inputs: list[Path], out: Path, *, overwrite: bool, source: str, features: str | None,
        allow_missing_features: bool) -> ImportReport:
    caps = Captions()
    blank = 0
    for path in inputs:
        doc = load_json(path, expect=list)
        for i, img in enumerate(doc):
            rec = f"[{i}]"
            if not isinstance(img, dict):
                raise InputFormatError(path, "expected an object with 'id' and 'regions'", rec)
            key = "id" if "id" in img else "image_id"
            image_id = canonical_image_id(need(img, key, int, path, rec))
            rec = f"[{i}] (image {image_id})"
            for j, region in enumerate(need(img, "regions", list, path, rec, nonempty=False)):
                rrec = f"{rec}.regions[{j}]"
                phrase = need(region, "phrase", str, path, rrec, nonempty=False)
                if not phrase.strip():
                    blank += 1
                    continue
                caps.add(image_id, phrase, path, rrec)
    options = {"source": source, "features": features,
               "allow_missing_features": allow_missing_features}
    report = merge_captions("vg-regions", caps, inputs, out, source=source, features=features,
                            allow_missing_features=allow_missing_features, overwrite=overwrite,
                            options=options)
    if blank:
        report.counts["skipped_blank_phrases"] = blank
    return report


register(Importer(
    name="vg-regions", kind="captions",
    summary="Visual Genome region_descriptions.json → captions on image shards",
    inputs="region_descriptions.json",
    description="Every region phrase becomes a caption of its image (by VG image id) in "
                "OUT/images/SOURCE/ (default vg); blank phrases are skipped and counted.",
    run=run,
    options=(Option("--source", "image folder name", default="vg"), FEATURES, ALLOW_MISSING)))
