"""A builder pool's shared reads (``training.shared_reads``), two members in one process on
threads, over a stream whose reads are logged: each member's reader runs ahead of its own
consumption by bytes (so that both readers work while the parts are taken in turn), into the
next epoch, and no further; the blocks each member sees are every block, in order."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from vlp.platform.training.shared_reads import PeerSockets, SharedReads

BLOCKS_PER_PART = 3


class CountedParts:
    """Four parts an epoch of three one-row blocks each; ``read`` logs (epoch, part, block)
    as each block is read."""

    def __init__(self):
        self.read: list[tuple[int, int, int]] = []
        self.lock = threading.Lock()

    def parts(self, epoch: int) -> list[tuple[int, int]]:
        return [(epoch, p) for p in range(4)]

    def part_name(self, part):
        return f"part {part}"

    def read_part(self, part):
        epoch, p = part
        for b in range(BLOCKS_PER_PART):
            with self.lock:
                self.read.append((epoch, p, b))
            yield pa.table({"block": [f"{epoch}.{p}.{b}"]})

    def read_by(self, member: int) -> set[tuple[int, int, int]]:
        with self.lock:
            return {r for r in self.read if r[1] % 2 == member}


def members(ahead_bytes: int):
    sockets = PeerSockets(2)
    stream = CountedParts()
    pair = [SharedReads(stream, k, 2, *sockets.ends(k), ahead_bytes=ahead_bytes)
            for k in range(2)]
    return stream, pair


def take_all(reads: SharedReads, epochs: range, into: list) -> threading.Thread:
    def run():
        for epoch in epochs:
            into.extend(t["block"][0].as_py() for t in reads(epoch))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_a_reader_reads_its_next_parts_while_the_peers_are_taken():
    """Member 0 has taken one block of part 0 and stopped; with room for several parts its
    reader has gone on to its part 2, and into epoch 1's parts (one epoch ahead), but not into
    epoch 2's (not yet asked for). Held to a few blocks, as before, it would have read part 0
    alone: the pool's readers took turns."""
    stream, (first, second) = members(ahead_bytes=1 << 20)
    seen_by_second: list[str] = []
    take_all(second, range(1), seen_by_second)
    blocks = first(0)
    assert next(blocks)["block"][0].as_py() == "0.0.0"
    want = {(e, p, b) for e in (0, 1) for p in (0, 2) for b in range(BLOCKS_PER_PART)}
    assert wait_for(lambda: stream.read_by(0) >= want), sorted(stream.read_by(0))
    time.sleep(0.2)   # and no further
    assert {e for e, _, _ in stream.read_by(0)} == {0, 1}


def test_the_read_ahead_is_held_to_its_bytes():
    """With room for less than a block, a reader holds one block read beyond those taken."""
    stream, (first, second) = members(ahead_bytes=1)
    take_all(second, range(1), [])
    blocks = first(0)
    next(blocks)
    assert wait_for(lambda: len(stream.read_by(0)) >= 2)
    time.sleep(0.2)
    assert len(stream.read_by(0)) == 2   # the one taken and one ahead
    next(blocks)
    assert wait_for(lambda: len(stream.read_by(0)) >= 3)


@pytest.mark.parametrize("ahead_bytes", [1, 1 << 20])
def test_each_member_sees_every_block_in_order_over_epochs(ahead_bytes):
    stream, (first, second) = members(ahead_bytes)
    got = [[], []]
    threads = [take_all(reads, range(3), seen) for reads, seen in zip((first, second), got)]
    for t in threads:
        t.join(20)
    want = [f"{e}.{p}.{b}" for e in range(3) for p in range(4) for b in range(BLOCKS_PER_PART)]
    assert got == [want, want]
    assert sorted(stream.read)[:len(want)] == sorted(  # each block read once in the pool
        (e, p, b) for e in range(3) for p in range(4) for b in range(BLOCKS_PER_PART))


def test_epochs_are_asked_for_in_order():
    _, (first, second) = members(1 << 20)
    take_all(second, range(1), [])
    list(first(0))
    with pytest.raises(RuntimeError, match="epoch 2 were asked for after epoch 0"):
        next(first(2))
