"""Importers from the public V+L formats into the vlp data folder (see ``data_folder``).

``run_import("butd-tsv", [tsv], "data/", source="coco")`` — or ``vlp data import`` — turns
a public file into image shards or task tables. Each format family lives in its own module
and registers itself by name; importing this package loads them all.
"""

from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.registry import (IMPORTERS, ImportReport, Importer, Option,
                                             get_importer, register, run_import)

# the modules register their formats on import; the order is the order of `--help`
from vlp.datasets.importers import (butd_tsv, uniter_npz, karpathy, vg_regions,  # noqa: E402,F401
                                    web_captions, vqa, nlvr2, snli_ve, refcoco, vcr,
                                    mattnet_dets)

__all__ = ["IMPORTERS", "ImportReport", "Importer", "InputFormatError", "Option",
           "get_importer", "register", "run_import"]
