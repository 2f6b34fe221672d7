"""vlp's own detection ops against direct computations written here with loops: RoIAlign
(per-box, per-sample bilinear as detectron2's kernel reads), NMS (the sequential greedy
scan), the box coder (round trip), anchors."""

from __future__ import annotations

import math

import pytest
import torch

from vlp.models.vision.detection.anchors import cell_anchors, grid_anchors
from vlp.models.vision.detection.box_coder import BoxCoder, clip_boxes
from vlp.models.vision.detection.nms import batched_nms, classwise_keep, nms
from vlp.models.vision.detection.roi_align import roi_align
from vlp.models.vision.detection.roi_pool import roi_pool

# tiny convs: one thread beats two threads fighting the other tests for 2 cores
torch.set_num_threads(1)


def _bilinear(fmap, y, x):
    """One sample of a (C, H, W) map, as detectron2's ROIAlign kernel computes it."""
    _, h, w = fmap.shape
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return torch.zeros(fmap.shape[0], dtype=torch.float64)
    y, x = max(y, 0.0), max(x, 0.0)
    yl, xl = int(y), int(x)
    if yl >= h - 1:
        yh = yl = h - 1
        y = float(yl)
    else:
        yh = yl + 1
    if xl >= w - 1:
        xh = xl = w - 1
        x = float(xl)
    else:
        xh = xl + 1
    ly, lx = y - yl, x - xl
    hy, hx = 1 - ly, 1 - lx
    f = fmap.double()
    return hy * hx * f[:, yl, xl] + hy * lx * f[:, yl, xh] + ly * hx * f[:, yh, xl] \
        + ly * lx * f[:, yh, xh]


def _roi_align_reference(feats, rois, out, scale, ratio, aligned):
    result = torch.zeros(len(rois), feats.shape[1], out, out, dtype=torch.float64)
    off = 0.5 if aligned else 0.0
    for k, (b, x1, y1, x2, y2) in enumerate(rois.tolist()):
        sx, sy, ex, ey = x1 * scale - off, y1 * scale - off, x2 * scale - off, y2 * scale - off
        rw, rh = ex - sx, ey - sy
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bw, bh = rw / out, rh / out
        gh = ratio if ratio > 0 else math.ceil(rh / out)
        gw = ratio if ratio > 0 else math.ceil(rw / out)
        count = max(gh * gw, 1)
        for ph in range(out):
            for pw in range(out):
                acc = torch.zeros(feats.shape[1], dtype=torch.float64)
                for iy in range(gh):
                    y = sy + ph * bh + (iy + 0.5) * bh / gh
                    for ix in range(gw):
                        x = sx + pw * bw + (ix + 0.5) * bw / gw
                        acc += _bilinear(feats[int(b)], y, x)
                result[k, :, ph, pw] = acc / count
    return result


@pytest.mark.parametrize("aligned,ratio", [(True, 0), (False, 0), (True, 2), (False, 1)])
def test_roi_align_matches_per_sample_bilinear(aligned, ratio):
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 3, 9, 13, generator=g)
    rois = torch.tensor([[0, 0.0, 0.0, 64.0, 48.0],      # whole map at scale 1/8 (edge clamp)
                         [1, 10.3, 7.1, 40.9, 30.2],
                         [0, 90.0, 60.0, 140.0, 90.0],   # partly outside the map
                         [1, 33.0, 20.0, 35.0, 21.0],    # smaller than one cell
                         [0, -20.0, -12.0, 8.0, 5.0],    # starts before the map
                         [1, 50.0, 30.0, 50.0, 30.0]])   # empty
    got = roi_align(feats, rois, output_size=4, spatial_scale=1 / 8, sampling_ratio=ratio,
                    aligned=aligned)
    want = _roi_align_reference(feats, rois, 4, 1 / 8, ratio, aligned)
    assert got.shape == (6, 3, 4, 4)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_roi_align_chunks_give_the_same_result():
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, 4, 10, 10, generator=g)
    rois = torch.cat([torch.zeros(7, 1), torch.rand(7, 2, generator=g) * 40,
                      40 + torch.rand(7, 2, generator=g) * 40], dim=1)
    whole = roi_align(feats, rois, 3, 1 / 8)
    chunked = roi_align(feats, rois, 3, 1 / 8, max_elements=1)
    torch.testing.assert_close(whole, chunked)


def _c_round(v):
    return math.floor(v + 0.5) if v >= 0 else -math.floor(-v + 0.5)


def _roi_pool_reference(feats, rois, out, scale):
    """torchvision's / detectron2's ROIPool CPU kernel, loop by loop."""
    _, c, h, w = feats.shape
    result = torch.zeros(len(rois), c, out, out, dtype=torch.float64)
    for k, (b, x1, y1, x2, y2) in enumerate(rois.tolist()):
        sw, sh, ew, eh = (_c_round(v * scale) for v in (x1, y1, x2, y2))
        rw, rh = max(ew - sw + 1, 1), max(eh - sh + 1, 1)
        for ph in range(out):
            for pw in range(out):
                hs = min(max(math.floor(ph * rh / out) + sh, 0), h)
                he = min(max(math.ceil((ph + 1) * rh / out) + sh, 0), h)
                ws = min(max(math.floor(pw * rw / out) + sw, 0), w)
                we = min(max(math.ceil((pw + 1) * rw / out) + sw, 0), w)
                if he <= hs or we <= ws:
                    continue
                result[k, :, ph, pw] = feats[int(b), :, hs:he, ws:we].double().amax(dim=(1, 2))
    return result


def test_roi_pool_matches_the_max_over_each_bin():
    g = torch.Generator().manual_seed(8)
    feats = torch.randn(2, 3, 9, 13, generator=g)
    rois = torch.tensor([[0, 0.0, 0.0, 104.0, 72.0],
                         [1, 10.3, 7.1, 40.9, 30.2],
                         [0, 90.0, 60.0, 140.0, 90.0],    # partly outside
                         [1, 33.0, 20.0, 35.0, 21.0],     # below one cell
                         [0, -20.0, -12.0, 8.0, 5.0],     # starts before the map
                         [1, 12.0, 4.0, 60.0, 4.0],       # flat: bins repeat one row
                         [0, 20.0, 20.0, 20.0, 20.0]])    # a point; 20/8 = 2.5 rounds up
    got = roi_pool(feats, rois, output_size=4, spatial_scale=1 / 8)
    torch.testing.assert_close(got.double(), _roi_pool_reference(feats, rois, 4, 1 / 8))
    chunked = roi_pool(feats, rois, output_size=4, spatial_scale=1 / 8, max_elements=1)
    torch.testing.assert_close(chunked, got)


def _iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _nms_reference(boxes, scores, thr):
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    keep = []
    for i in order:
        if all(_iou(boxes[i], boxes[j]) <= thr for j in keep):
            keep.append(i)
    return keep


def _random_boxes(n, g, extent=100.0):
    xy = torch.rand(n, 2, generator=g) * extent
    wh = 5 + torch.rand(n, 2, generator=g) * extent / 3
    return torch.cat([xy, xy + wh], dim=1)


@pytest.mark.parametrize("thr", [0.3, 0.5, 0.7])
def test_nms_matches_the_greedy_scan(thr):
    g = torch.Generator().manual_seed(2)
    boxes = _random_boxes(120, g)
    scores = torch.rand(120, generator=g)
    scores[5] = scores[7]                               # a tie: input order decides
    want = _nms_reference(boxes.tolist(), scores.tolist(), thr)
    assert nms(boxes, scores, thr).tolist() == want
    assert nms(boxes, scores, thr, max_keep=7).tolist() == want[:7]


def test_nms_prefix_search_is_exact_when_the_prefix_keeps_too_few():
    # 300 copies of one box then distinct boxes: the first prefix keeps a single box
    g = torch.Generator().manual_seed(3)
    same = torch.tensor([[0.0, 0.0, 10.0, 10.0]]).repeat(300, 1)
    other = _random_boxes(40, g, extent=1000.0) + 20
    boxes = torch.cat([same, other])
    scores = torch.cat([torch.linspace(1.0, 0.9, 300), torch.rand(40, generator=g) * 0.8])
    want = _nms_reference(boxes.tolist(), scores.tolist(), 0.5)
    assert nms(boxes, scores, 0.5, max_keep=20).tolist() == want[:20]


def test_batched_nms_is_nms_per_group():
    g = torch.Generator().manual_seed(4)
    boxes = _random_boxes(90, g)
    scores = torch.rand(90, generator=g)
    groups = torch.randint(0, 4, (90,), generator=g)
    got = set(batched_nms(boxes, scores, groups, 0.4).tolist())
    want = set()
    for c in range(4):
        idx = (groups == c).nonzero().squeeze(1).tolist()
        keep = _nms_reference([boxes[i].tolist() for i in idx], [scores[i].item() for i in idx],
                              0.4)
        want |= {idx[i] for i in keep}
    assert got == want


def test_classwise_keep_is_nms_per_class_on_shared_boxes():
    g = torch.Generator().manual_seed(5)
    boxes = _random_boxes(50, g)
    scores = torch.softmax(torch.randn(50, 7, generator=g) * 2, dim=1)
    valid = scores >= 0.1
    keep = classwise_keep(boxes, scores, 0.3, valid=valid, max_elements=3 * 50 * 50)
    for c in range(7):
        idx = valid[:, c].nonzero().squeeze(1).tolist()
        ref = _nms_reference([boxes[i].tolist() for i in idx],
                             [scores[i, c].item() for i in idx], 0.3)
        assert set(keep[:, c].nonzero().squeeze(1).tolist()) == {idx[i] for i in ref}
    every = classwise_keep(boxes, scores, 0.3)
    for c in range(7):
        ref = _nms_reference(boxes.tolist(), scores[:, c].tolist(), 0.3)
        assert set(every[:, c].nonzero().squeeze(1).tolist()) == set(ref)


def test_box_coder_round_trip_and_clip():
    g = torch.Generator().manual_seed(6)
    ref = _random_boxes(30, g)
    target = _random_boxes(30, g)
    for weights in [(1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0)]:
        coder = BoxCoder(weights)
        deltas = coder.encode(ref, target)
        torch.testing.assert_close(coder.decode(deltas, ref), target, atol=1e-3, rtol=1e-4)
        # k sets of deltas per box (one per class)
        two = coder.decode(torch.cat([deltas, torch.zeros_like(deltas)], dim=1), ref)
        torch.testing.assert_close(two[:, 4:], ref, atol=1e-4, rtol=1e-5)
    huge = BoxCoder().decode(torch.tensor([[0.0, 0.0, 50.0, 50.0]]), ref[:1])
    assert torch.isfinite(huge).all()
    clipped = clip_boxes(torch.tensor([[-5.0, -1.0, 120.0, 30.0]]), height=20, width=100)
    assert clipped.tolist() == [[0.0, 0.0, 100.0, 20.0]]


def test_anchors_layout():
    cell = cell_anchors((32, 64), (0.5, 1.0, 2.0))
    assert cell.shape == (6, 4)
    w, h = cell[:, 2] - cell[:, 0], cell[:, 3] - cell[:, 1]
    torch.testing.assert_close(w * h, torch.tensor([32.0**2] * 3 + [64.0**2] * 3))
    torch.testing.assert_close(h / w, torch.tensor([0.5, 1.0, 2.0] * 2))
    grid = grid_anchors(cell, feat_h=2, feat_w=3, stride=16)
    assert grid.shape == (2 * 3 * 6, 4)
    # location (y=1, x=2) → shift (32, 16), anchor 4 → cell[4] shifted
    torch.testing.assert_close(grid[(1 * 3 + 2) * 6 + 4],
                               cell[4] + torch.tensor([32.0, 16, 32, 16]))
