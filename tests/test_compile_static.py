"""``torch.compile`` with static shapes (``train.compile``: ``compile_static.py``): the
model's forward and loss for every task of the four tiny families — as the loop runs them,
``objective.forward`` on the real batcher's batches through the ``Prefetcher`` — trace as
one graph (``fullgraph=True``: a graph break raises), ``dynamic=False``, one compile per
(task, shape) and none for a shape met before, and give eager's outputs.

Dynamo alone does the tracing here (a counting backend that runs the captured graph as it
is): graph breaks and recompiles are dynamo's, and inductor's compile of each graph on a CPU
takes minutes; one inductor check (uniter-tiny's MLM) holds its outputs equal to eager's.
"""

from __future__ import annotations

import pytest
import torch

from test_forward_host_syncs import TINY, _draws, _family_setup, corpus  # noqa: F401
from vlp.datasets.stream.local_stream import local_batches
from vlp.platform.training import objective
from vlp.platform.training.prefetch import Prefetcher
from vlp.testing.toy import InOrderSampler

torch.set_num_threads(1)


def shape_key(batch) -> tuple:
    return tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in _tensors(batch)))


def _tensors(batch, prefix=""):
    for k, v in batch.items():
        if torch.is_tensor(v):
            yield prefix + k, v
        elif isinstance(v, dict):
            yield from _tensors(v, f"{prefix}{k}.")


def _rerun(model, fn, batch, seed):
    """``fn(batch)`` from the same RNG and running statistics (SOHO's dictionary) as before."""
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    torch.manual_seed(seed)
    out = {k: v.detach().float() for k, v in fn(batch).items()}
    with torch.no_grad():
        for k, v in model.named_buffers():
            v.copy_(buffers[k])
    return out


def _batches(name, tiny_world, corpus, rounds):
    family, tasks, model, plan = _family_setup(name, tiny_world, corpus)
    model.train()
    draws = _draws(family, tasks)
    warm = [draws[0]] if hasattr(model.backbone.visual, "dictionary") else []
    source = local_batches(plan)
    prefetch = Prefetcher(InOrderSampler(warm + draws * rounds), source, depth=0,
                          device=torch.device("cpu"))
    items = [prefetch.next() for _ in range(len(warm) + len(draws) * rounds)]
    prefetch.close()
    source.close()
    for item in items[:len(warm)]:      # SOHO's dictionary takes its first batch's entries
        objective.forward(model, item.batch, item.task)["loss"].backward()
    model.zero_grad(set_to_none=True)
    return model, items[len(warm):]


@pytest.mark.parametrize("name", TINY)
def test_every_task_compiles_to_one_graph_per_shape_equal_to_eager(name, tiny_world, corpus):
    _compiles_per_shape(name, tiny_world, corpus, "padded")


def test_varlen_attention_compiles_to_one_graph_per_shape_equal_to_eager(tiny_world, corpus):
    """``transformer.attention: varlen`` (varlen_attention.py): its segments a fixed-shape
    input like the padding mask (on a CPU their dense mask; CUDA's nested path is the GPU
    check's)."""
    _compiles_per_shape("uniter-tiny", tiny_world, corpus, "varlen")


def _compiles_per_shape(name, tiny_world, corpus, layout):
    import torch._dynamo as dynamo

    model, items = _batches(name, tiny_world, corpus, rounds=2)
    model.backbone.set_attention_layout(layout)
    tasks = list(dict.fromkeys(i.task for i in items))
    # every task once; the first task's second batch too (another shape, or the same again)
    items = items[:len(tasks)] + items[len(tasks):len(tasks) + 1]
    for task in tasks:
        dynamo.reset()
        graphs = []

        def counting(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        def fn(batch, task=task):
            return objective.forward(model, batch, task)

        compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=counting)
        shapes = set()
        for item in (i for i in items if i.task == task):
            shapes.add(shape_key(item.batch))
            want = _rerun(model, fn, item.batch, 1)
            got = _rerun(model, compiled, item.batch, 1)
            assert len(graphs) == len(shapes), (name, task, len(graphs), len(shapes))
            assert got.keys() == want.keys()
            for k in want:
                torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6,
                                           msg=f"{name} {task} {k}")
            _rerun(model, compiled, item.batch, 1)     # the same shape again: no compile
            assert len(graphs) == len(shapes), (name, task, "recompiled a shape met before")


def test_inductor_matches_eager(tiny_world, corpus):
    """One inductor compile (uniter-tiny's MLM) with ``compile_static``'s settings."""
    import torch._dynamo as dynamo

    from vlp.platform.training.compile_static import compile_static

    model, items = _batches("uniter-tiny", tiny_world, corpus, rounds=1)
    item = next(i for i in items if i.task == "mlm")
    model.eval()     # no dropout: inductor draws its random numbers its own way
    want = _rerun(model, lambda b: objective.forward(model, b, "mlm"), item.batch, 0)
    dynamo.reset()
    compile_static(model)
    got = _rerun(model, lambda b: objective.forward(model, b, "mlm"), item.batch, 0)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=k)
