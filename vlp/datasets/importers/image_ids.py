"""One spelling per image id, whatever the public file calls it.

The same COCO image is ``391895`` in VQA, RefCOCO and the original BUTD TSVs,
``COCO_val2014_000000391895`` in the LXMERT TSVs and Karpathy file names, and
``coco_val2014_000000391895.npz`` in UNITER's dumps; a Flickr30K image is ``1000092795.jpg``
in the Karpathy and SNLI-VE files and ``1000092795`` in its TSV. Captions and task tables
attach to image shards by id, so every importer stores ids in this canonical form:

- a file extension is dropped;
- a COCO name ``[coco_]{train,val,test}20NN_<digits>`` becomes the bare number (COCO ids are
  unique across its 2014/2015 splits);
- an all-digit id loses its leading zeros;
- anything else (NLVR2 ``dev-850-0-img0``, VCR file stems, hashes) is kept as written.

Ids of different corpora may still coincide (a VG id and a COCO id can be the same number):
keep each corpus in its own ``images/<source>/`` folder.
"""

from __future__ import annotations

import re

_COCO_NAME = re.compile(r"^(?:coco_)?(?:train|val|test)20\d\d_0*(\d+)$", re.IGNORECASE)
_EXTENSIONS = (".jpg", ".jpeg", ".png", ".npz", ".npy", ".gif", ".bmp", ".webp")


def canonical_image_id(raw: object) -> str:
    """The canonical string id for ``raw`` (an int, a name or a file name)."""
    if isinstance(raw, bool):  # bool is an int subclass; an id is never a bool
        raise ValueError(f"image id {raw!r} is a boolean")
    if isinstance(raw, int):
        return str(raw)
    text = str(raw).strip()
    name = text.rsplit("/", 1)[-1]
    if name.lower().endswith(_EXTENSIONS):
        name = name.rsplit(".", 1)[0]
    m = _COCO_NAME.match(name)
    if m:
        return str(int(m.group(1)))
    if name.isdigit():
        return str(int(name))
    return name
