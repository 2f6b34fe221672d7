"""The BUTD extractor (random ``butd-tiny`` on small generated images) against the region
contract, BUTD's region rule against its reference loop, batched against one-at-a-time,
and the converter against state dicts laid out like the public detectron2 checkpoint."""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import replace

import numpy as np
import pytest
import torch

from vlp.models.vision.detection.butd import build_butd
from vlp.models.vision.detection.butd_config import butd_config
from vlp.models.vision.detection.butd_convert import check_butd_weights, weights_problems
from vlp.models.vision.detection.region_select import select_regions
from butd_images import SETTINGS, synthetic_image as _image

# tiny convs: one thread beats two threads fighting the other tests for 2 cores
torch.set_num_threads(1)


def _run(extractor, images):
    prepared = [extractor.prepare(im) for im in images]
    return extractor.extract([torch.from_numpy(x) for x, _ in prepared],
                             [s for _, s in prepared], [im.shape[:2] for im in images])


@pytest.fixture(scope="module", params=["roi_pool", "roi_align"])
def tiny(request):
    torch.manual_seed(0)
    extractor = build_butd(None, SETTINGS, size="tiny")
    # the same weights with the other pooler (the public weights use roi_pool)
    extractor.detector.roi_heads.cfg = replace(extractor.detector.cfg, pooler=request.param)
    return extractor


def test_butd_tiny_regions_meet_the_contract(tiny):
    images = [_image(120, 180, 0), _image(200, 90, 1), _image(64, 64, 2)]
    results = _run(tiny, images)
    for im, r in zip(images, results):
        h, w = im.shape[:2]
        n = r["boxes"].shape[0]
        assert SETTINGS.min_boxes <= n <= SETTINGS.max_boxes
        b = r["boxes"]
        assert b.dtype == np.float32 and b.shape == (n, 4)
        assert (b[:, 0] >= 0).all() and (b[:, 1] >= 0).all()
        assert (b[:, 2] <= w).all() and (b[:, 3] <= h).all()
        assert (b[:, 2] >= b[:, 0]).all() and (b[:, 3] >= b[:, 1]).all()
        assert r["confidences"].shape == (n,) and (np.diff(r["confidences"]) <= 0).all()
        assert r["features"].dtype == np.float16 and r["features"].shape == (n, 128)
        assert np.isfinite(r["features"]).all()
        assert r["soft_labels"].shape == (n, 11)
        np.testing.assert_allclose(r["soft_labels"].sum(1), 1.0, atol=1e-5)
        assert r["image_feature"].dtype == np.float16 and r["image_feature"].shape == (128,)
        assert np.isfinite(r["image_feature"]).all()
    meta = tiny.metadata()
    assert meta["extractor"] == "butd-tiny" and meta["weights_sha256"] == "random-init"


def test_batched_features_equal_one_at_a_time(tiny):
    """A batch of mixed sizes and aspects (landscape, portrait, square, one resized to a side
    that is no multiple of the strides) is one padded canvas: every image's regions and
    features are those it gets alone."""
    images = [_image(120, 180, 3), _image(180, 100, 4), _image(97, 97, 5),
              _image(90, 140, 6), _image(210, 130, 7)]
    together = _run(tiny, images)
    assert len({tiny.prepare(im)[0].shape for im in images}) == len(images)
    for im, batched in zip(images, together):
        alone = _run(tiny, [im])[0]
        np.testing.assert_array_equal(batched["boxes"].shape, alone["boxes"].shape)
        np.testing.assert_allclose(batched["boxes"], alone["boxes"], atol=1e-3)
        np.testing.assert_allclose(batched["confidences"], alone["confidences"], atol=1e-4)
        np.testing.assert_allclose(batched["features"].astype(np.float32),
                                   alone["features"].astype(np.float32), rtol=2e-3, atol=1e-3)
        np.testing.assert_allclose(batched["image_feature"].astype(np.float32),
                                   alone["image_feature"].astype(np.float32),
                                   rtol=2e-3, atol=1e-3)


def _iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _butd_reference(boxes, probs, nms_t, conf_t, lo, hi):
    """generate_tsv.py's loop: NMS per class, max kept score, threshold, min/max boxes."""
    r, c = probs.shape
    max_conf = np.zeros(r)
    for j in range(c):
        order = sorted(range(r), key=lambda i: (-probs[i, j], i))
        keep = []
        for i in order:
            if all(_iou(boxes[i], boxes[k]) <= nms_t for k in keep):
                keep.append(i)
        for i in keep:
            max_conf[i] = max(max_conf[i], probs[i, j])
    chosen = np.where(max_conf >= conf_t)[0]
    ranked = sorted(range(r), key=lambda i: (-max_conf[i], i))
    if len(chosen) < lo:
        return ranked[:lo], max_conf
    return ranked[:min(len(chosen), hi)], max_conf


# peaked rows (enough pass 0.2), flat rows over few classes (the floor drops once), flat
# rows over many classes (the floor drops to the full problem)
@pytest.mark.parametrize("sharpness,classes,lo,hi", [(6.0, 9, 3, 8), (0.3, 9, 5, 9),
                                                     (0.1, 120, 6, 9)])
def test_region_rule_matches_the_reference_loop(sharpness, classes, lo, hi):
    g = torch.Generator().manual_seed(7)
    xy = torch.rand(40, 2, generator=g) * 60
    boxes = torch.cat([xy, xy + 8 + torch.rand(40, 2, generator=g) * 30], dim=1)
    probs = torch.softmax(torch.randn(40, classes, generator=g) * sharpness, dim=1)[:, 1:]
    idx, conf = select_regions(boxes, probs, 0.3, 0.2, lo, hi)
    want, max_conf = _butd_reference(boxes.tolist(), probs.double().numpy(), 0.3, 0.2, lo, hi)
    assert idx.tolist() == want
    np.testing.assert_allclose(conf.numpy(), max_conf[want], rtol=1e-6)


def _public_layout(size: str, attributes: bool) -> dict[str, tuple[int, ...]]:
    """The key names and shapes of py-bottom-up-attention's R101-C4 checkpoint, written out
    from detectron2's naming (not from vlp's model), at the widths of ``size``."""
    w = {"base": dict(stem=64, out=256, width=64, blocks=(3, 4, 23), res5=3, rpn=512,
                      anchors=12, classes=1601, attrs=401, embed=256, attr_hidden=512),
         "tiny": dict(stem=8, out=16, width=4, blocks=(1, 1, 1), res5=1, rpn=16,
                      anchors=9, classes=11, attrs=5, embed=4, attr_hidden=8)}[size]
    keys: dict[str, tuple[int, ...]] = {}

    def conv(prefix, cin, cout, k):
        keys[f"{prefix}.weight"] = (cout, cin, k, k)
        for n in ("weight", "bias", "running_mean", "running_var"):
            keys[f"{prefix}.norm.{n}"] = (cout,)

    def stage(prefix, n, cin, width, cout):
        for b in range(n):
            if b == 0:
                conv(f"{prefix}.{b}.shortcut", cin, cout, 1)
            conv(f"{prefix}.{b}.conv1", cin if b == 0 else cout, width, 1)
            conv(f"{prefix}.{b}.conv2", width, width, 3)
            conv(f"{prefix}.{b}.conv3", width, cout, 1)

    conv("backbone.stem.conv1", 3, w["stem"], 7)
    cin = w["stem"]
    for s, n in enumerate(w["blocks"]):
        stage(f"backbone.res{s + 2}", n, cin, w["width"] * 2 ** s, w["out"] * 2 ** s)
        cin = w["out"] * 2 ** s
    stage("roi_heads.res5", w["res5"], cin, w["width"] * 8, w["out"] * 8)
    d, a = w["out"] * 8, w["anchors"]
    rpn = "proposal_generator.rpn_head"
    keys.update({f"{rpn}.conv.weight": (w["rpn"], cin, 3, 3), f"{rpn}.conv.bias": (w["rpn"],),
                 f"{rpn}.objectness_logits.weight": (a, w["rpn"], 1, 1),
                 f"{rpn}.objectness_logits.bias": (a,),
                 f"{rpn}.anchor_deltas.weight": (4 * a, w["rpn"], 1, 1),
                 f"{rpn}.anchor_deltas.bias": (4 * a,)})
    bp = "roi_heads.box_predictor"
    keys.update({f"{bp}.cls_score.weight": (w["classes"], d),
                 f"{bp}.cls_score.bias": (w["classes"],),
                 f"{bp}.bbox_pred.weight": ((w["classes"] - 1) * 4, d),
                 f"{bp}.bbox_pred.bias": ((w["classes"] - 1) * 4,)})
    if attributes:
        keys.update({f"{bp}.cls_embedding.weight": (w["classes"], w["embed"]),
                     f"{bp}.fc_attr.weight": (w["attr_hidden"], d + w["embed"]),
                     f"{bp}.fc_attr.bias": (w["attr_hidden"],),
                     f"{bp}.attr_score.weight": (w["attrs"], w["attr_hidden"]),
                     f"{bp}.attr_score.bias": (w["attrs"],)})
    return keys


@pytest.mark.parametrize("attributes", [False, True])
def test_base_model_has_the_public_checkpoint_layout(attributes):
    layout = _public_layout("base", attributes)
    state = {k: torch.empty(s, device="meta") for k, s in layout.items()}
    assert weights_problems(state, butd_config("base")) == []


def _tiny_state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    state = {k: (rng.standard_normal(s) * 0.1).astype(np.float32)
             for k, s in _public_layout("tiny", attributes=True).items()}
    for k in state:
        if k.endswith("running_var"):
            state[k] = np.abs(state[k]) + 1.0
    state["pixel_mean"] = np.asarray([102.9801, 115.9465, 122.7717], np.float32).reshape(3, 1, 1)
    state["pixel_std"] = np.ones((3, 1, 1), np.float32)
    return state


def test_converter_loads_pkl_and_pth_alike(tmp_path):
    state = _tiny_state()
    pkl, pth = tmp_path / "butd.pkl", tmp_path / "butd.pth"
    with open(pkl, "wb") as f:
        pickle.dump({"model": state, "__author__": "test"}, f, protocol=2)
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, pth)
    assert check_butd_weights(str(pkl), "tiny") == []
    a, b = build_butd(str(pkl), SETTINGS, "tiny"), build_butd(str(pth), SETTINGS, "tiny")
    assert a.weights_sha256 == hashlib.sha256(pkl.read_bytes()).hexdigest()
    assert a.metadata()["weights_sha256"] == a.weights_sha256
    own = a.detector.state_dict()
    for k, v in state.items():
        if not k.startswith("pixel_"):
            np.testing.assert_array_equal(own[k].numpy(), v)
    # prepare: shorter side to short_side, still uint8 RGB; on the device: BGR less Caffe's
    # means
    x, scale = a.prepare(np.tile(np.asarray([123, 116, 103], np.uint8), (120, 180, 1)))
    assert x.shape == (96, 144, 3) and x.dtype == np.uint8 and scale == pytest.approx(0.8)
    y = a._normalise(torch.from_numpy(x)).numpy()
    assert y.shape == (3, 96, 144) and y.dtype == np.float32
    np.testing.assert_allclose(y[:, 5, 7], [103 - 102.9801, 116 - 115.9465, 123 - 122.7717],
                               atol=1e-4)
    assert a.detector.has_attributes
    images = [_image(100, 150, 8)]
    ra, rb = _run(a, images)[0], _run(b, images)[0]
    np.testing.assert_array_equal(ra["features"], rb["features"])


def test_converter_names_each_bad_key_in_one_line(tmp_path):
    state = _tiny_state()
    state["roi_heads.box_predictor.cls_score.weight"] = np.zeros((12, 128), np.float32)
    del state["backbone.res3.0.conv2.weight"]
    state["roi_heads.box_predictor.mask_head.weight"] = np.zeros(3, np.float32)
    path = tmp_path / "bad.pth"
    torch.save({"model": {k: torch.from_numpy(v) for k, v in state.items()}}, path)
    lines = check_butd_weights(str(path), "tiny")
    assert len(lines) == 3, lines
    assert any("missing key backbone.res3.0.conv2.weight" in ln and "(8, 8, 3, 3)" in ln
               for ln in lines)
    assert any("cls_score.weight has shape (12, 128), expected (11, 128)" in ln for ln in lines)
    assert any("unknown key roi_heads.box_predictor.mask_head.weight" in ln for ln in lines)
    with pytest.raises(ValueError) as e:
        build_butd(str(path), SETTINGS, "tiny")
    assert str(e.value).splitlines() == lines


def test_converter_refuses_other_input_normalisation(tmp_path):
    state = _tiny_state()
    state["pixel_mean"] = np.asarray([123.675, 116.28, 103.53], np.float32)   # RGB order
    path = tmp_path / "rgb.pth"
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, path)
    (line,) = check_butd_weights(str(path), "tiny")
    assert "pixel_mean is [123.675, 116.28, 103.53]" in line and "102.9801" in line


def test_converter_refuses_a_pickle_that_names_code(tmp_path):
    # eval, not print: Ray's progress bars replace builtins.print in a process that ran a Ray
    # Data job (tqdm_ray.safe_print), and such a pickle then names that function instead
    class Boom:
        def __reduce__(self):
            return (eval, ("1",))
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"model": {"x": Boom()}}))
    (line,) = check_butd_weights(str(path), "tiny")
    assert "refused" in line and "builtins.eval" in line and str(path) in line


def test_low_precision_path_runs_and_stays_close(tiny, monkeypatch):
    """The GPU's autocast path (fp16 there) exercised on CPU with bf16: mixed dtypes through
    the trunk, the pooling and the head still give finite features near fp32's."""
    images = [_image(120, 180, 9)]
    full = _run(tiny, images)[0]
    monkeypatch.setattr(tiny, "_autocast_dtype", lambda device: torch.bfloat16)
    low = _run(tiny, images)[0]
    assert np.isfinite(low["features"]).all() and low["features"].dtype == np.float16
    a, b = full["image_feature"].astype(np.float32), low["image_feature"].astype(np.float32)
    assert np.abs(a - b).max() <= 0.03 * np.abs(a).max()
