"""Where the ranks of a process group meet: a TCP store that the process handing out the
address opens on a port the kernel picks (rank 0's actor, the local runner, a test), and
holds open for the group's life (groups made later, DeepSpeed's among them, meet there
too); every rank joins it as a client.

Why not a "free port" (bind port 0, read the number, close, hand the number to rank 0, whose
store binds it later): between the close and rank 0's bind any process on the node can take
the port; every outgoing TCP connection takes a local port from the same ephemeral range,
and a node running Ray makes them by the hundred. Rank 0 then fails with EADDRINUSE, and the
other ranks retry their connection until the group's timeout (30 minutes for gloo): a run
that hangs where it should have failed. It happened in this project's CI (rank 1 of 2 left
waiting on a port rank 0 could not bind; docs/testing.md, "Engine ranks meet at a store the
test holds").

torchrun's agent hosts its workers' store for the same reason; ``AGENT_STORE_ENV`` is the
variable that makes torch's ``env://`` rendezvous join such a store as a client (for scripts
that call ``init_process_group`` with no store of their own, as the tests' ranks do).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

# torch's env:// and tcp:// rendezvous: every rank a client of a store someone else hosts
AGENT_STORE_ENV = {"TORCHELASTIC_USE_AGENT_STORE": "True"}


def open_store(host: str = "127.0.0.1") -> Any:
    """A TCP store server on a port the kernel picks (``.port``), nobody's client yet. Keep
    the object until the group has formed: the server closes with it."""
    from torch.distributed import TCPStore

    return TCPStore(host, 0, is_master=True, wait_for_workers=False)


def join_group(backend: str, address: str, port: int, rank: int, world: int,
               timeout: timedelta | None = None) -> None:
    """This process into the default group as ``rank`` of ``world``, through the store at
    ``address:port`` (``open_store``'s, held by whoever handed out the address). Without
    ``timeout`` the group keeps torch's default for ``backend`` (NCCL's is shorter than
    gloo's), and the store waits as long as gloo's."""
    import torch.distributed as dist
    from torch.distributed import TCPStore
    from torch.distributed.constants import default_pg_timeout

    store = TCPStore(address, int(port), world_size=world, is_master=False,
                     timeout=timeout or default_pg_timeout)
    extra = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, **extra)
