"""The leakage audit (``vlp data audit``): pretraining images and captions against every
benchmark's evaluation splits (``leakage``), by image keys and near-duplicate captions
(``keys``), split overlap (``splits``), task tables (``task_tables``) and the exclusion list
written for pretraining (``exclude``)."""
