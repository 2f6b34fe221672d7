"""Downstream benchmark data: task tables + downstream image shards → batches of the batch
contract (``vlp/contract/batch_spec.py``) plus each benchmark's labels
(``vlp/contract/downstream_keys.py``).

One adapter per benchmark table (``vqa.py``, ``ve.py``, ``nlvr2.py``, ``retrieval.py``,
``refexp.py``, ``vcr.py``); all of them look images up by ``image_id`` in an Arrow-backed
:class:`~vlp.datasets.downstream.image_store.ImageStore` and reuse the pretraining pipeline's
tokenizer, region selection, location features and collate. No Ray, no MLflow here.
"""

from vlp.datasets.downstream.downstream_config import DownstreamDataConfig, data_config_for
from vlp.datasets.downstream.data_errors import DownstreamDataError, MissingImagesError
from vlp.datasets.downstream.image_store import ImageStore
from vlp.datasets.downstream.sampling import EpochSampler

__all__ = ["DownstreamDataConfig", "data_config_for", "DownstreamDataError",
           "MissingImagesError", "ImageStore", "EpochSampler"]
