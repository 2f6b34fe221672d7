"""A background thread that pulls Arrow blocks epoch after epoch into a bounded queue.

Reading ahead overlaps data transfer with the train step; the bounded queue keeps host memory
flat.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable

import pyarrow as pa

from vlp.datasets.batching.image_block import ImageBlock

BLOCK, EPOCH_END, ERROR = "block", "epoch_end", "error"


class BlockReader(threading.Thread):
    def __init__(self, blocks: Callable[[int], Iterable[pa.Table]],
                 to_block: Callable[[pa.Table], ImageBlock], capacity: int, start_epoch: int):
        super().__init__(name="vlp-block-reader", daemon=True)
        self._blocks = blocks
        self._to_block = to_block
        self.queue: queue.Queue = queue.Queue(maxsize=capacity)
        self.epoch = start_epoch
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                rows = 0
                for table in self._blocks(self.epoch):
                    if table.num_rows == 0:
                        continue
                    rows += table.num_rows
                    if not self._put((BLOCK, self._to_block(table), self.epoch)):
                        return
                if not self._put((EPOCH_END, self.epoch, rows)):
                    return
                self.epoch += 1
        except BaseException as e:   # surfaced in the consumer's thread
            self._put((ERROR, e, None))

    def _put(self, item) -> bool:
        while not self._stop_event.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False
