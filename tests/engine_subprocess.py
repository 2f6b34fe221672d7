"""A real DeepSpeed engine in a fresh Python process, cheaply: one gloo rank (world size 1)
meeting at a store this process holds (``rank_group``), no Ray. A subprocess, not the test
process: ``deepspeed.initialize`` and the process group leave global state (the accelerator,
the comm backend, ZeRO's hooks) that must not leak into the other tests.

``run_one_rank(body, *args)`` runs ``body`` after ``ONE_RANK`` (``sys.argv[1]`` is the port,
``args`` follow as ``sys.argv[2:]``); the body prints ``"RESULT" + json.dumps(...)`` once,
and that object is returned. ``ray_train=True`` also runs ``RAY_TRAIN``: stand-ins for
``ray.train``'s context, report and checkpoint, so that the loop's ``_Worker`` runs in the
process as under Ray Train on one worker."""

from __future__ import annotations

import contextlib
import json
import os
import textwrap
from typing import Iterator

from preloaded_python import run_python
from vlp.platform.training.rendezvous import AGENT_STORE_ENV, open_store

ONE_RANK = textwrap.dedent("""
    import json, os, sys, tempfile
    import torch, torch.distributed as dist

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
""")

# ray.train as the loop sees it on one worker. A checkpoint the loop reports is kept as Ray
# Train keeps it (the loop's temporary folder goes away after the report): its copy's path is
# appended to ``kept``; ``restore[0]`` is what ``get_checkpoint`` hands back (a resume).
RAY_TRAIN = textwrap.dedent("""
    import ray.train

    root = tempfile.mkdtemp()

    class Context:
        def get_world_rank(self): return 0
        def get_world_size(self): return 1
        def get_local_rank(self): return 0

    kept, restore = [], [None]

    def report(metrics, checkpoint=None, checkpoint_dir_name=None):
        if checkpoint is not None:
            dst = os.path.join(root, f"{len(kept)}-{checkpoint_dir_name}")
            checkpoint.to_directory(dst)
            kept.append(dst)

    ray.train.get_context = Context
    ray.train.report = report
    ray.train.get_checkpoint = lambda: restore[0]
""")


@contextlib.contextmanager
def rank_group() -> Iterator[tuple[str, dict[str, str]]]:
    """(port, env) for a test's ranks: the port of a rendezvous store this process opens and
    holds for the block (``vlp.platform.training.rendezvous``: a port found free and handed
    to rank 0 can be taken before rank 0 binds it, and the other ranks then wait out the
    group's timeout), and this process's environment with the ranks told to join that store
    as clients (what their ``init_process_group``'s ``env://`` rendezvous then does)."""
    store = open_store()
    try:
        yield str(store.port), {**os.environ, **AGENT_STORE_ENV}
    finally:
        del store


def run_one_rank(body: str, *args: str, cwd, ray_train: bool = False,
                 timeout: float = 300) -> dict:
    """Run ``body`` in a one-rank process (see the module docstring); return its RESULT."""
    script = ONE_RANK + (RAY_TRAIN if ray_train else "") + textwrap.dedent(body)
    with rank_group() as (port, env):
        (proc,) = run_python(script, [[port, *args]], env=env, cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])
