"""The GPU check's measuring code (``check.Check`` and the parts it runs); the entry script is
``jobs/benchmarks/gpu_check.py``."""
