"""The driver side of the pretraining data: the ``data`` config section (``data_config``), the
plan of sources and shards (``data_plan``), and the Ray Data stream (``pipeline``; ``local_stream``
runs the same map in-process) whose map turns image-shard rows into tokenized, region-selected
image rows (``image_rows``, ``text_tokenizer``, ``region_select``, ``location``, ``pixels``)."""
