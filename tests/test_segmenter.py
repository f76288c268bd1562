"""F_seg on a tiny random Sam3TrackerModel: geometry, batching, caching, loading (DESIGN §5)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from monailabel_xflow.geometry import Click, GeometryError, pixel_to_point, pixels_to_box  # noqa: E402
from monailabel_xflow.segmenter.base import (  # noqa: E402
    PromptableSegmenter,
    SegmentationResult,
    SegmenterInputError,
    image_key,
)
from monailabel_xflow.segmenter.cache import EmbeddingCache, default_cache  # noqa: E402
from monailabel_xflow.segmenter.configs import build_random_sam3  # noqa: E402
from monailabel_xflow.segmenter.loading import load_segmenter  # noqa: E402
from monailabel_xflow.segmenter.sam3 import Sam3Segmenter  # noqa: E402

H, W = 256, 320  # asymmetric on purpose: a transposition anywhere changes shapes or coordinates


@pytest.fixture(scope="module")
def loaded(tiny_sam3) -> Sam3Segmenter:
    return load_segmenter(tiny_sam3, device="cpu", cache=EmbeddingCache())


@pytest.fixture()
def seg(loaded) -> Sam3Segmenter:
    """The module's model behind a fresh predictor and a fresh cache (loading once keeps it fast)."""
    return Sam3Segmenter(loaded.model, device="cpu", cache=EmbeddingCache())


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    rng = np.random.default_rng(0)
    img = rng.random((H, W)).astype(np.float32) * 0.3
    img[: H // 2, : W // 2] += 0.7  # a bright top-left quadrant marks the orientation
    return img


class CallCounter:
    """Wraps a method of one object (undone after the test), counting calls thread-safely and
    keeping their arguments and outputs."""

    def __init__(self, monkeypatch, obj, name):
        self.calls, self.outputs, self._lock = [], [], threading.Lock()
        original = getattr(obj, name)

        def wrapper(*args, **kwargs):
            with self._lock:
                self.calls.append((args, kwargs))
            out = original(*args, **kwargs)
            with self._lock:
                self.outputs.append(out)
            return out

        monkeypatch.setattr(obj, name, wrapper)

    def __len__(self):
        return len(self.calls)


# --- loading and interface -----------------------------------------------------------------------


def test_load_segmenter_from_hf_folder_gives_a_cpu_fp32_promptable_segmenter(seg):
    assert isinstance(seg, Sam3Segmenter)
    assert isinstance(seg, PromptableSegmenter)
    assert seg.device.type == "cpu" and seg.dtype == torch.float32
    assert not seg.model.training


def test_load_segmenter_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_segmenter(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):
        load_segmenter("./missing/sam3.pt")
    with pytest.raises(ValueError, match="backend"):
        load_segmenter(tmp_path, backend="onnx")


def test_hub_id_passes_local_files_only_when_offline(monkeypatch, tiny_sam3):
    from transformers import Sam3TrackerModel

    seen = {}
    real = Sam3TrackerModel.from_pretrained.__func__

    def fake(cls, name, **kwargs):
        seen[name] = kwargs
        return real(cls, tiny_sam3)

    monkeypatch.setattr(Sam3TrackerModel, "from_pretrained", classmethod(fake))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    load_segmenter("facebook/sam3", device="cpu", cache=EmbeddingCache())
    assert seen["facebook/sam3"] == {"local_files_only": True}
    monkeypatch.delenv("HF_HUB_OFFLINE")
    load_segmenter("facebook/sam3", device="cpu", cache=EmbeddingCache())
    assert seen["facebook/sam3"] == {"local_files_only": False}


def test_device_and_dtype_choice():
    from monailabel_xflow.weights import choose_device, choose_dtype

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert choose_device().type == expected
    assert choose_dtype(torch.device("cpu")) == torch.float32
    assert choose_dtype(torch.device("cpu"), "bfloat16") == torch.bfloat16
    with pytest.raises(ValueError, match="floating"):
        choose_dtype(torch.device("cpu"), "int8")


def test_official_backend_refuses_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal is for CPU-only machines")
    from monailabel_xflow.segmenter.official import Sam3BackendUnavailable

    with pytest.raises(Sam3BackendUnavailable, match="CUDA"):
        load_segmenter("facebook/sam3", backend="official")


def test_official_backend_refuses_a_cpu_device_even_with_cuda():
    from monailabel_xflow.segmenter.official import Sam3BackendUnavailable, require_official_backend

    with pytest.raises(Sam3BackendUnavailable, match="CUDA only"):
        require_official_backend("cpu")


# --- preprocessing -------------------------------------------------------------------------------


def test_preprocess_grey_to_rgb_resize_and_normalise(seg, image):
    x = seg.preprocess(image)
    assert tuple(x.shape) == (1, 3, 1008, 1008) and x.dtype == torch.float32
    assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 0], x[:, 2])
    assert float(seg.preprocess(np.ones((H, W), np.float32)).min()) == pytest.approx(1.0)
    assert float(seg.preprocess(np.zeros((H, W), np.float32)).max()) == pytest.approx(-1.0)
    # orientation: the bright top-left quadrant stays top-left in the 1008 x 1008 input
    top_left, bottom_right = x[0, 0, :400, :400].mean(), x[0, 0, -400:, -400:].mean()
    assert top_left > 0.5 > -0.3 > bottom_right


def test_uint8_grey_and_uint8_rgb_give_the_same_input(seg):
    grey = (np.arange(H * W) % 251).reshape(H, W).astype(np.uint8)
    rgb = np.repeat(grey[..., None], 3, axis=2)
    assert torch.equal(seg.preprocess(grey), seg.preprocess(rgb))
    assert torch.allclose(seg.preprocess(grey), seg.preprocess(grey.astype(np.float32) / 255.0))


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.zeros((8, 8, 4), np.uint8), "shape"),
        (np.zeros((2, 8, 8, 3), np.float32), "shape"),
        (np.full((8, 8), 1.5, np.float32), r"\[0, 1\]"),
        (np.full((8, 8), np.nan, np.float32), "NaN"),
        (np.zeros((8, 8), np.int32), "dtype"),
    ],
)
def test_bad_images_are_refused_with_the_reason(seg, bad, match):
    with pytest.raises(SegmenterInputError, match=match):
        seg.set_image(bad)


# --- geometry ------------------------------------------------------------------------------------


def test_prompts_reach_the_model_in_1008_pixel_coordinates(monkeypatch, seg, image):
    seg.set_image(image)
    spy = CallCounter(monkeypatch, seg.model, "forward")
    # a box given in original pixels (x 80..240, y 128..256) and a click on pixel (row 64, col 240)
    box = pixels_to_box([80, 128, 240, 256], (H, W))
    cx, cy = pixel_to_point(64, 240, (H, W))
    result = seg.predict([box], clicks=[[Click(True, cx, cy), Click(False, 0.5, 0.25)]])
    kwargs = spy.calls[-1][1]
    sx, sy = 1008 / W, 1008 / H
    np.testing.assert_allclose(kwargs["input_boxes"][0, 0].numpy(), [80 * sx, 128 * sy, 240 * sx, 256 * sy], rtol=1e-6)
    np.testing.assert_allclose(
        kwargs["input_points"][0, 0].numpy(), [[240.5 * sx, 64.5 * sy], [160 * sx, 64 * sy]], rtol=1e-6
    )
    assert kwargs["input_labels"][0, 0].tolist() == [1, 0]
    assert result.masks.shape == (1, H, W) and result.masks.dtype == bool
    assert result.logits.shape == (1, H, W) and result.logits.dtype == np.float32
    assert result.iou.shape == (1,) and result.iou.dtype == np.float32
    assert result.low_res_logits.shape == (1, 1, 288, 288) and result.low_res_logits.dtype == np.float32


def test_a_reduced_input_model_gets_prompts_in_its_own_grid(monkeypatch, tmp_path, image):
    """A 336-px tracker (the demo's): same contract, prompts scaled to 336, 96 x 96 low-res logits."""
    small = load_segmenter(
        build_random_sam3(tmp_path / "s336", size="tiny", image_size=336), device="cpu", cache=EmbeddingCache()
    )
    assert small.input_size == 336 and small.low_res_size == (96, 96)
    assert tuple(small.preprocess(image).shape) == (1, 3, 336, 336)
    small.set_image(image)
    spy = CallCounter(monkeypatch, small.model, "forward")
    box = pixels_to_box([80, 128, 240, 256], (H, W))
    first = small.predict([box])
    sx, sy = 336 / W, 336 / H
    np.testing.assert_allclose(
        spy.calls[-1][1]["input_boxes"][0, 0].numpy(), [80 * sx, 128 * sy, 240 * sx, 256 * sy], rtol=1e-6
    )
    assert first.masks.shape == (1, H, W) and first.low_res_logits.shape == (1, 1, 96, 96)
    again = small.predict([box], [[Click(True, 0.5, 0.7)]], previous=first.low_res_logits)
    assert again.low_res_logits.shape == (1, 1, 96, 96)
    with pytest.raises(ValueError, match="multiple of 14"):
        build_random_sam3(tmp_path / "bad", size="tiny", image_size=300)
    with pytest.raises(ValueError, match="1008"):
        build_random_sam3(tmp_path / "bad", size="full", image_size=336)


def test_logits_are_the_low_res_logits_upsampled_without_transposition(monkeypatch, seg, image):
    seg.set_image(image)
    spy = CallCounter(monkeypatch, seg.model, "forward")
    result = seg.predict([(0.1, 0.2, 0.6, 0.9), (0.5, 0.0, 1.0, 0.5)])
    pred = spy.outputs[-1].pred_masks[:, 0, :1].float()  # (N, 1, 288, 288), single-mask output
    np.testing.assert_array_equal(result.low_res_logits, pred.numpy())
    up = torch.nn.functional.interpolate(pred, size=(H, W), mode="bilinear", align_corners=False)[:, 0]
    np.testing.assert_allclose(result.logits, up.numpy(), atol=1e-6)
    np.testing.assert_array_equal(result.masks, result.logits > 0)


def test_bad_prompts_are_refused(seg, image):
    with pytest.raises(RuntimeError, match="set_image"):
        seg.predict([(0, 0, 1, 1)])
    seg.set_image(image)
    with pytest.raises(GeometryError, match="normalised"):
        seg.predict([(0.1, 0.1, 1.5, 0.5)])
    with pytest.raises(GeometryError, match="ordered"):
        seg.predict([(0.6, 0.1, 0.5, 0.5)])
    with pytest.raises(GeometryError, match="4 values"):
        seg.predict([(0.1, 0.1, 0.5)])
    with pytest.raises(GeometryError, match="click"):
        seg.predict([(0.1, 0.1, 0.5, 0.5)], clicks=[[Click(True, 1.2, 0.3)]])
    with pytest.raises(SegmenterInputError, match="one list per box"):
        seg.predict([(0.1, 0.1, 0.5, 0.5)], clicks=[[], []])
    with pytest.raises(SegmenterInputError, match="previous"):
        seg.predict([(0.1, 0.1, 0.5, 0.5)], previous=np.zeros((2, 1, 288, 288), np.float32))


def test_no_boxes_gives_an_empty_result(seg, image):
    seg.set_image(image)
    result = seg.predict([])
    assert isinstance(result, SegmentationResult) and len(result) == 0
    assert result.masks.shape == (0, H, W) and result.low_res_logits.shape == (0, 1, 288, 288)


# --- encode once, batch the decoder --------------------------------------------------------------


def test_encoder_runs_once_for_a_whole_revision(monkeypatch, seg, image):
    encodes = CallCounter(monkeypatch, seg.model, "get_image_embeddings")
    decodes = CallCounter(monkeypatch, seg.model, "forward")
    boxes = [(0.1, 0.1, 0.5, 0.6), (0.4, 0.3, 0.9, 0.8), (0.0, 0.5, 0.3, 1.0)]
    seg.set_image(image)
    result = seg.predict(boxes)
    clicks = [[] for _ in boxes]
    for step in range(4):  # Stage 2: up to T=4 clicks, each with the previous logits
        for i, box in enumerate(boxes):
            clicks[i].append(Click(step % 2 == 0, (box[0] + box[2]) / 2, (box[1] + box[3]) / 2))
        result = seg.predict(boxes, clicks=clicks, previous=result.low_res_logits)
    seg.set_image(image.copy())  # same content, another array: no new encode
    seg.predict(boxes)
    assert len(encodes) == 1
    assert len(decodes) == 6  # one batched decoder call per predict, whatever the number of boxes
    seg.set_image(np.flipud(image).copy())
    assert len(encodes) == 2


def test_two_segmenters_on_the_same_weights_share_embeddings(tiny_sam3, image):
    cache = EmbeddingCache()
    a = load_segmenter(tiny_sam3, device="cpu", cache=cache)
    b = load_segmenter(tiny_sam3, device="cpu", cache=cache)
    a.set_image(image)
    b.set_image(image)
    assert cache.stats.misses == 1 and cache.stats.hits == 1
    np.testing.assert_array_equal(a.predict([(0.1, 0.1, 0.5, 0.5)]).logits, b.predict([(0.1, 0.1, 0.5, 0.5)]).logits)


def test_batched_boxes_equal_one_box_at_a_time(seg, image):
    seg.set_image(image)
    boxes = [(0.1, 0.1, 0.5, 0.6), (0.4, 0.3, 0.9, 0.8), (0.0, 0.5, 0.3, 1.0)]
    clicks = [
        [Click(True, 0.3, 0.3), Click(False, 0.2, 0.2)],
        [Click(True, 0.6, 0.5), Click(True, 0.95, 0.9)],
        [Click(False, 0.1, 0.7), Click(True, 0.2, 0.9)],
    ]
    first = seg.predict(boxes)
    batched = seg.predict(boxes, clicks=clicks, previous=first.low_res_logits, multimask=True)
    for i, box in enumerate(boxes):
        alone = seg.predict([box], clicks=[clicks[i]], previous=first.low_res_logits[i : i + 1], multimask=True)
        np.testing.assert_allclose(batched.logits[i], alone.logits[0], atol=1e-5)
        np.testing.assert_allclose(batched.iou[i], alone.iou[0], atol=1e-6)
        np.testing.assert_array_equal(batched.masks[i], alone.masks[0])


def test_boxes_with_different_click_counts_are_padded(monkeypatch, seg, image):
    seg.set_image(image)
    spy = CallCounter(monkeypatch, seg.model, "forward")
    boxes = [(0.1, 0.1, 0.5, 0.6), (0.4, 0.3, 0.9, 0.8)]
    clicks = [[Click(True, 0.3, 0.3)], [Click(True, 0.6, 0.5), Click(False, 0.8, 0.7), Click(True, 0.5, 0.4)]]
    batched = seg.predict(boxes, clicks=clicks)
    assert spy.calls[-1][1]["input_labels"][:, 0].tolist() == [[1, -10, -10], [1, 0, 1]]
    # padding tokens embed as zeros; they stay in the decoder's attention, hence a tolerance
    alone = seg.predict([boxes[0]], clicks=[clicks[0]])
    np.testing.assert_allclose(batched.logits[0], alone.logits[0], atol=1e-3)


def test_previous_low_res_logits_are_used(monkeypatch, seg, image):
    seg.set_image(image)
    box, clicks = [(0.2, 0.2, 0.7, 0.7)], [[Click(True, 0.4, 0.4)]]
    first = seg.predict(box)
    spy = CallCounter(monkeypatch, seg.model, "forward")
    with_previous = seg.predict(box, clicks=clicks, previous=first.low_res_logits)
    np.testing.assert_array_equal(spy.calls[-1][1]["input_masks"].numpy(), first.low_res_logits)
    without = seg.predict(box, clicks=clicks)
    assert not np.allclose(with_previous.logits, without.logits)


def test_multimask_returns_the_highest_iou_hypothesis(monkeypatch, seg, image):
    seg.set_image(image)
    spy = CallCounter(monkeypatch, seg.model, "forward")
    result = seg.predict([(0.1, 0.1, 0.5, 0.6), (0.4, 0.3, 0.9, 0.8)], multimask=True)
    out = spy.outputs[-1]
    assert out.pred_masks.shape[2] == 3
    best = out.iou_scores[:, 0].argmax(dim=1)
    for i in range(2):
        np.testing.assert_array_equal(result.low_res_logits[i, 0], out.pred_masks[i, 0, best[i]].numpy())
        assert result.iou[i] == pytest.approx(float(out.iou_scores[i, 0].max()))


def test_real_radiograph_round_trip(seg, cxr_samples):
    from PIL import Image

    png = sorted((cxr_samples / "nih" / "images").glob("*.png"))[0]
    with Image.open(png) as im:
        grey = np.asarray(im.convert("L"), dtype=np.float32) / 255.0
    seg.set_image(grey)
    result = seg.predict([(0.55, 0.25, 0.9, 0.75)], clicks=[[Click(True, 0.7, 0.5)]])
    assert result.masks.shape == (1, *grey.shape)


# --- the embedding cache -------------------------------------------------------------------------


def test_image_key_is_content_based():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert image_key(a) == image_key(a.copy()) == image_key(np.asfortranarray(a))
    assert image_key(a) != image_key(a.T.copy())  # same bytes, other shape
    assert image_key(a) != image_key(a.astype(np.float64))
    b = a.copy()
    b[1, 1] += 1
    assert image_key(a) != image_key(b)


def test_a_checked_image_is_checked_and_hashed_once(monkeypatch, seg, image):
    """The workflow's border check is trusted: a cached set_image of the same checked image
    neither checks, copies nor hashes again; a new array of the same content is hashed once and
    finds the embedding."""
    from monailabel_xflow.geometry import check_image
    from monailabel_xflow.segmenter import base

    hashes = CallCounter(monkeypatch, base.hashlib, "sha256")
    encodes = CallCounter(monkeypatch, seg.model, "get_image_embeddings")
    checked = check_image(image)
    seg.set_image(checked)
    seg.set_image(checked)
    seg.fork().set_image(checked)
    assert image_key(checked) == seg.cache.keys()[0].rsplit(":", 1)[1]
    assert len(hashes) == 1 and len(encodes) == 1
    seg.set_image(check_image(image.copy()))  # the next request: another array, same pixels
    assert len(hashes) == 2 and len(encodes) == 1
    assert image_key(image.copy()) == image_key(checked)  # a plain array: the same key, hashed each time


def test_cache_is_lru_bounded_by_entries():
    cache = EmbeddingCache(max_entries=2, max_bytes=1 << 20)
    for key in "abc":
        cache.get_or_compute(key, lambda: np.zeros(4))
        if key == "b":
            cache.get("a")  # refresh a: b becomes the least recently used
    assert cache.keys() == ["a", "c"] and cache.stats.evictions == 1


def test_cache_is_bounded_by_bytes_and_skips_oversized_values():
    cache = EmbeddingCache(max_entries=10, max_bytes=1000)
    for key in range(4):
        cache.get_or_compute(key, lambda: np.zeros(100, np.float32))  # 400 bytes each
    assert len(cache) == 2 and cache.nbytes == 800 and cache.keys() == [2, 3]
    big = cache.get_or_compute("big", lambda: np.zeros(1000, np.float32))
    assert big.shape == (1000,) and "big" not in cache and cache.nbytes == 800
    tensors = [torch.zeros(10), torch.zeros(5, dtype=torch.float64)]
    cache.put("t", tensors)
    assert cache.nbytes == 800 + 80 and cache.keys() == [2, 3, "t"]
    cache.put("u", np.zeros(50, np.float32))  # 200 more bytes: the oldest entry goes
    assert cache.nbytes == 400 + 80 + 200 and cache.keys() == [3, "t", "u"]


def test_cache_computes_once_for_concurrent_callers():
    cache = EmbeddingCache()
    calls, start = [], threading.Barrier(6)

    def compute():
        calls.append(1)
        time.sleep(0.2)
        return np.ones(3)

    results = [None] * 6

    def worker(i):
        start.wait()
        results[i] = cache.get_or_compute("k", compute)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and all(r is results[0] for r in results)


def test_a_failed_computation_is_not_cached():
    cache = EmbeddingCache()

    def boom():
        raise RuntimeError("encoder failed")

    with pytest.raises(RuntimeError, match="encoder failed"):
        cache.get_or_compute("k", boom)
    assert "k" not in cache
    assert cache.get_or_compute("k", lambda: 5) == 5


def test_cache_bounds_are_validated():
    with pytest.raises(ValueError, match="max_entries"):
        EmbeddingCache(max_entries=0)
    with pytest.raises(ValueError, match="max_bytes"):
        EmbeddingCache(max_bytes=-1)


def test_default_cache_is_process_wide():
    assert default_cache() is default_cache()


def test_concurrent_set_image_of_one_image_encodes_once(monkeypatch, seg, image):
    encodes = CallCounter(monkeypatch, seg.model, "get_image_embeddings")
    workers = [seg.fork() for _ in range(4)]
    start = threading.Barrier(len(workers))
    errors = []

    def run(worker):
        try:
            start.wait()
            worker.set_image(image)
            worker.predict([(0.1, 0.1, 0.5, 0.5)])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(encodes) == 1
