"""``rendezvous``: ranks meet at a store the launching process opened on a port the kernel
picked (never a port found free and bound later by rank 0, which another process can take
in between: rank 0 then fails and the others wait out the group's timeout). Both ways in:
``join_group`` (the worker group, the doctor, the local runner) and torch's ``env://`` with
``AGENT_STORE_ENV`` (the tests' ranks); a group made after the first uses the same store."""

from __future__ import annotations

import json
import os
import socket
import textwrap

from preloaded_python import run_python
from vlp.platform.training.rendezvous import AGENT_STORE_ENV, open_store

RANK = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    from vlp.platform.training.rendezvous import join_group

    rank, port, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if how == "join_group":
        join_group("gloo", "127.0.0.1", port, rank, 2)
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
    x = torch.tensor([rank + 1.0])
    dist.all_reduce(x)
    sub = dist.new_group([0, 1])            # after the group formed: through the same store
    y = torch.tensor([10.0 * (rank + 1)])
    dist.all_reduce(y, group=sub)
    dist.destroy_process_group()
    print("RESULT" + json.dumps([x.item(), y.item()]))
""")


def _two_ranks(how: str, env: dict[str, str]) -> list[list[float]]:
    store = open_store()
    with socket.socket() as s:              # the port is the store's from the start
        assert s.connect_ex(("127.0.0.1", store.port)) == 0
    procs = run_python(RANK, [[r, store.port, how] for r in (0, 1)], env=env, timeout=120)
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
    return [json.loads(p.stdout.split("RESULT", 1)[1]) for p in procs]


def test_ranks_join_a_store_held_by_the_launcher_and_make_groups_through_it():
    env = {k: v for k, v in os.environ.items() if k not in AGENT_STORE_ENV}
    assert _two_ranks("join_group", env) == [[3.0, 30.0]] * 2


def test_env_rendezvous_joins_the_held_store_as_a_client():
    assert _two_ranks("env", {**os.environ, **AGENT_STORE_ENV}) == [[3.0, 30.0]] * 2
