"""Image → regions extractors for `vlp data extract` (registry.py lists them by name)."""
