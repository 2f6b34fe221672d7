"""``train.compile``: the model under ``torch.compile`` with static shapes.

``fullgraph=True``: a graph break is an error, not a silent split (every family's forward
and loss trace as one graph: tests/test_compile_static.py). ``dynamic=False``: one graph
per (task, batch shape), each specialised to its sizes, which CUDA graphs can then replay;
with dynamic shapes the encoder compiled on the H200 ran 1.22× slower than eager at 10,240
units (docs/gpu-check.md). So it pays only where the batcher emits few shapes per task (the
bucketed micro-batch shapes of issue 41): each new shape compiles once, and the recompile
limit is raised to a bucket set's size so that dynamo does not fall back to eager after
eight shapes. Off by default: on a CPU inductor's compile takes minutes for a step's worth
of gain.
"""

from __future__ import annotations

import torch

# graphs per compiled code object: a few tasks × up to ~12 bucketed shapes each
RECOMPILE_LIMIT = 128


def compile_static(model: torch.nn.Module, backend: str = "inductor") -> None:
    """Compile ``model`` in place (parameter names, and so checkpoints, stay the plain
    model's)."""
    import torch._dynamo.config as dynamo_config

    if getattr(dynamo_config, "recompile_limit", RECOMPILE_LIMIT) < RECOMPILE_LIMIT:
        dynamo_config.recompile_limit = RECOMPILE_LIMIT
    model.compile(fullgraph=True, dynamic=False, backend=backend)
