"""Test doubles and fixtures shipped in the package: the toy model, batch source and task
sampler (``toy``) and random batches of the batch contract (``example_batches``).

They live in the package, not in ``tests/``, because Ray Train workers and the benchmarks in
``jobs/benchmarks/`` import them; production code never does.
"""
