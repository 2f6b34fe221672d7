"""``WindowRegions.gather`` (a batch's region arrays, one gather per block) against the plain
gather: the blocks' rows laid end to end, a zero row after them, one take."""

import numpy as np

from vlp.datasets.batching.image_block import ImageBlock
from vlp.datasets.batching.window_collate import WindowRegions

NAMES = ("features", "region_loc", "soft_labels")


def random_blocks(rng, count):
    blocks = []
    for _ in range(count):
        n = rng.integers(0, 6, rng.integers(1, 9))   # regions per image, some images none
        rows = int(n.sum())
        blk = ImageBlock(None, np.arange(len(n)), np.zeros(len(n), np.int64),
                         np.zeros(len(n) + 1, np.int64), np.zeros(1, np.int64),
                         np.zeros(0, np.int32), 0, 0, num_regions=n,
                         region_start=np.concatenate([[0], np.cumsum(n)]),
                         features=rng.standard_normal((rows, 16)).astype(np.float16),
                         region_loc=rng.standard_normal((rows, 7)).astype(np.float32),
                         soft_labels=rng.random((rows, 5)).astype(np.float16))
        blocks.append(blk)
    return blocks


def batch_rows(rng, blocks, starts, B):
    """[B, N] rows as the window collate numbers them: each example one image's regions, then
    the zero row past every block's rows."""
    images = [(j, r) for j, b in enumerate(blocks) for r in range(b.num_images)]
    pick = [images[i] for i in rng.integers(0, len(images), B)]
    n = np.array([blocks[j].num_regions[r] for j, r in pick])
    N = int(n.max()) + int(rng.integers(0, 3))   # trimmed to the longest, or not (a swap)
    idx = np.full((B, N), starts[-1], np.int64)
    for i, (j, r) in enumerate(pick):
        idx[i, :n[i]] = starts[j] + blocks[j].region_start[r] + np.arange(n[i])
    return idx


def test_gather_equals_one_take_over_the_blocks_end_to_end():
    rng = np.random.default_rng(0)
    for trial in range(200):
        blocks = random_blocks(rng, int(rng.integers(1, 6)))
        source = WindowRegions(blocks, soft=True)
        idx = batch_rows(rng, blocks, source.starts, int(rng.integers(1, 12)))
        got = source.gather(idx, NAMES)
        for name, g in zip(NAMES, got):
            parts = [getattr(b, name) for b in blocks]
            flat = np.concatenate(parts + [np.zeros((1, parts[0].shape[1]), parts[0].dtype)])
            want = np.take(flat, idx.reshape(-1), axis=0).reshape(*idx.shape, flat.shape[1])
            assert g.dtype == want.dtype and g.shape == want.shape
            assert np.array_equal(g, want), (trial, name)

