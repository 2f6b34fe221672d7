"""Pretraining: the experiment config (``config``), what the workers build (``components``,
``data``), the Ray Train run (``run``) and the job around it (``job``: resolve, preflight,
tracking, resume)."""
