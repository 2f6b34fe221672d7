"""The worker side of the pretraining data: blocks from the stream (``block_reader``) become
a window of examples (``example_window``, ``image_block``), cut into batches by input units
(``length_buckets``), gathered (``collate``, ``window_collate``), given ITM negatives
(``itm_negatives``) and masked for the task the sampler drew (``task_sampler``), or for
every task of the mix on one example set (``summed_batch``: the summed objective);
``pretrain_batches`` is the batch source the training loop iterates. ``text_corpus`` serves
the text-only batches of ``mlm-text``."""
