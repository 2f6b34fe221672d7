"""Pretraining: the experiment config (``experiment_config``), what the workers build
(``components``,
``data``, the initial weights checked on the driver in ``init_weights_check``), the run on the
general loop (``run``: resolve, preflight, the ``LoopConfig`` and tracking spec built from the
experiment config) and the job around it (``job``: every check once, then the loop)."""
