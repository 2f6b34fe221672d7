"""Web alt-text corpora: Conceptual Captions (TSV) and SBU Captions (two line files).

Conceptual Captions ``Train_GCC-training.tsv`` / ``Validation_GCC-1.1.0-Validation.tsv``:
one ``caption<TAB>url`` per line, no header. SBU Captions: ``SBU_captioned_photo_dataset_urls.txt``
and ``SBU_captioned_photo_dataset_captions.txt``, line i of one belongs to line i of the other.

Neither names its images, so the image id is derived (``--id-from``) the way your feature
extraction named the downloaded files: ``line`` = the 0-based line number (the default),
``url-sha1`` = sha1 hex of the URL, ``url-stem`` = the URL's file name without extension
(SBU: ``4385058960_b0f291553e``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlparse

from vlp.datasets.importers.caption_merge import ALLOW_MISSING, FEATURES, Captions, merge_captions
from vlp.datasets.importers.import_error import InputFormatError, line
from vlp.datasets.importers.image_ids import canonical_image_id
from vlp.datasets.importers.readers import iter_tsv, open_text
from vlp.datasets.importers.registry import Importer, ImportReport, Option, register

ID_FROM = ("line", "url-sha1", "url-stem")


def image_id_for(id_from: str, index: int, url: str, path: Path, record: str) -> str:
    if id_from == "line":
        return str(index)
    if not url.startswith(("http://", "https://")):
        raise InputFormatError(path, f"{url[:60]!r} is not an http(s) URL", record)
    if id_from == "url-sha1":
        return hashlib.sha1(url.encode()).hexdigest()
    stem = Path(urlparse(url).path).name
    if not stem:
        raise InputFormatError(path, f"URL {url[:60]!r} has no file name", record)
    return canonical_image_id(stem)


def _lines(path: Path) -> list[str]:
    with open_text(path) as f:
        try:
            return [s.rstrip("\r\n") for s in f]
        except UnicodeDecodeError as e:
            raise InputFormatError(path, f"not UTF-8 text: {e.reason}") from None


def run_cc(inputs: list[Path], out: Path, *, overwrite: bool, source: str, id_from: str,
           features: str | None, allow_missing_features: bool) -> ImportReport:
    if id_from == "line" and len(inputs) > 1:
        raise ValueError("--id-from line numbers the lines of each file from 0, so ids of "
                         "several files would collide: import the files one at a time, each "
                         "into its own --source")
    caps = Captions()
    for path in inputs:
        for n, (caption, url) in iter_tsv(path, 2, "caption, url"):
            rec = line(n)
            caps.add(image_id_for(id_from, n - 1, url.strip(), path, rec), caption, path, rec)
    return _merge("cc-tsv", caps, inputs, out, overwrite, source, id_from, features,
                  allow_missing_features)


def run_sbu(inputs: list[Path], out: Path, *, overwrite: bool, source: str, id_from: str,
            features: str | None, allow_missing_features: bool) -> ImportReport:
    url_path, cap_path = inputs
    urls, captions = _lines(url_path), _lines(cap_path)
    if urls and not urls[0].startswith("http") and captions and captions[0].startswith("http"):
        raise InputFormatError(url_path, "does not hold URLs but the second input does: give "
                                         "the URL file first, then the caption file")
    if len(urls) != len(captions):
        raise InputFormatError(cap_path, f"{len(captions)} lines, but the URL file {url_path} "
                                         f"has {len(urls)}: the two must be parallel")
    caps = Captions()
    for i, (url, caption) in enumerate(zip(urls, captions)):
        if not url.strip() and not caption.strip():
            continue
        caps.add(image_id_for(id_from, i, url.strip(), url_path, line(i + 1)), caption,
                 cap_path, line(i + 1))
    return _merge("sbu", caps, inputs, out, overwrite, source, id_from, features,
                  allow_missing_features)


def _merge(name, caps, inputs, out, overwrite, source, id_from, features, allow_missing):
    options = {"source": source, "id_from": id_from, "features": features,
               "allow_missing_features": allow_missing}
    return merge_captions(name, caps, inputs, out, source=source, features=features,
                          allow_missing_features=allow_missing, overwrite=overwrite,
                          options=options)


def _id_option() -> Option:
    return Option("--id-from", "how image ids were named when you extracted features: line "
                               "(0-based line number), url-sha1, url-stem (URL file name "
                               "without extension)", default="line", choices=ID_FROM)


register(Importer(
    name="cc-tsv", kind="captions",
    summary="Conceptual Captions TSV (caption<TAB>url) → captions on image shards",
    inputs="Train_GCC-training.tsv (and/or the validation TSV)",
    description="One caption per image; the image id is derived from the line or URL "
                "(--id-from). Attaches to OUT/images/SOURCE/ (default cc).",
    run=run_cc,
    options=(Option("--source", "image folder name", default="cc"), _id_option(), FEATURES,
             ALLOW_MISSING)))

register(Importer(
    name="sbu", kind="captions",
    summary="SBU Captions (URL file + caption file) → captions on image shards",
    inputs="SBU_captioned_photo_dataset_urls.txt SBU_captioned_photo_dataset_captions.txt "
           "(in this order)",
    description="Line i of the caption file describes the image at line i of the URL file; "
                "the image id is derived from the line or URL (--id-from). Attaches to "
                "OUT/images/SOURCE/ (default sbu).",
    run=run_sbu, min_inputs=2, max_inputs=2,
    options=(Option("--source", "image folder name", default="sbu"), _id_option(), FEATURES,
             ALLOW_MISSING)))
