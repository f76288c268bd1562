"""The click path before the decoder: a person's click on an image whose embedding is cached.

One ``POST /infer/xflow_revise`` hands :meth:`XFlow.revise` a freshly loaded radiograph and the
clicks; everything it does before the mask decoder runs is overhead on an interactive click (the
embedding is cached, so no encoder runs). Timed per request, from the loaded image to the
decoder call, on a new copy of the image each time (a new request loads the file again):

* ``before``: the steps of main at 266e3f9, reproduced: ``geometry.check_image`` (view), the
  clicks, ``fork``, ``to_rgb01`` (validation again, an ``(H, W, 3)`` float copy), a blake2b hash
  of the pixels, then the cache look-up;
* ``after``: :meth:`XFlow.revise` as it is, up to the segmenter's ``predict`` call (the one image
  check at the border makes a read-only copy; the segmenter trusts it and hashes it once with
  sha256, then looks the embedding up).

Both ask the same :class:`~monailabel_xflow.segmenter.cache.EmbeddingCache`, which holds the
embedding before the timing starts (a tiny random SAM3 tracker computes it; the decoder itself
is not timed).

Two more per-image costs the same change removed, timed on the same image:

* "all findings" Stage 1 prompts: seven ``stage1_prompt`` calls (each made its own PIL image and
  ran the image processor) against one ``stage1_prompts`` call (one image, one processor pass),
  with the tiny offline Gemma 3 processor (its image side is 32 px: the per-image work is the PIL
  conversion and the resize of the full radiograph);
* a trace's mask: ``rle.encode`` (what every Stage 2 turn paid) against ``rle.LazyRLE`` (what a
  turn pays now when no trace is written), on an elliptic lesion mask.

Usage::

    .venv/bin/python benchmarks/bench_click_path.py [--height 2500 --width 2048] [--repeats 20]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import median_ms, parse_args

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def before_image_key(image: np.ndarray) -> str:
    """main's ``segmenter.base.image_key``: blake2b over dtype, shape and bytes."""
    array = np.ascontiguousarray(image)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{array.dtype.str}|{array.shape}|".encode())
    digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def before_check_image(image: np.ndarray) -> np.ndarray:
    """main's ``geometry.check_image`` (returns a float32 view, checks nothing twice within)."""
    arr = np.asarray(image)
    if arr.ndim != 2:
        raise ValueError(arr.shape)
    arr = arr.astype(np.float32, copy=False)
    if not np.isfinite(arr).all() or float(arr.min()) < 0.0 or float(arr.max()) > 1.0:
        raise ValueError("bad image")
    return arr


def before_to_rgb01(image: np.ndarray) -> np.ndarray:
    """main's ``segmenter.base.to_rgb01`` for a float ``(H, W)`` image: checks again, RGB copy."""
    rgb = image.astype(np.float32, copy=False)
    if not np.isfinite(rgb).all():
        raise ValueError("NaN")
    lo, hi = float(rgb.min()), float(rgb.max())
    if lo < -1e-6 or hi > 1 + 1e-6:
        raise ValueError("range")
    rgb = np.clip(rgb, 0.0, 1.0)
    return np.repeat(rgb[..., None], 3, axis=2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--height", type=int, default=2500, help="image rows (a typical CR/DX: 2500 x 2048)")
    parser.add_argument("--width", type=int, default=2048, help="image columns")
    parser.add_argument("--repeats", type=int, default=20, help="requests timed per path (median reported)")
    args = parse_args(parser, height=64, width=48, repeats=7)  # 7: one hiccup cannot make the median

    from monailabel_xflow.geometry import Click, check_click, grow_box, make_box
    from monailabel_xflow.segmenter.cache import EmbeddingCache
    from monailabel_xflow.segmenter.configs import build_random_sam3
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.testing import ScriptedPolicy
    from monailabel_xflow.workflow.xflow import XFlow

    rng = np.random.default_rng(0)
    image = rng.random((args.height, args.width)).astype(np.float32)
    clicks = [Click(True, 0.4, 0.5), Click(False, 0.6, 0.55)]
    box = (0.3, 0.3, 0.7, 0.7)

    with tempfile.TemporaryDirectory(prefix="bench-click-path-") as tmp:
        cache = EmbeddingCache()
        seg = load_segmenter(build_random_sam3(Path(tmp) / "sam3", size="tiny", seed=0), device="cpu", cache=cache)
        seg.set_image(image)  # the embedding both paths find in the cache (after's key)
        cache.put(f"{seg.cache_tag}:{before_image_key(image)}", cache.get(f"{seg.cache_tag}:{_after_key(image)}"))

        def before(request_image: np.ndarray) -> float:
            start = time.perf_counter()
            img = before_check_image(request_image)
            checked = [check_click(c) for c in clicks]
            b = make_box(*box)
            for c in checked:
                b = grow_box(b, c)
            twin = seg.fork()
            before_to_rgb01(img)
            key = f"{twin.cache_tag}:{before_image_key(img)}"
            if cache.get(key) is None:
                raise RuntimeError("the before path missed the cache")
            return time.perf_counter() - start  # the decoder call would start here

        stamps: list[float] = []

        class Stamped:
            """The real segmenter; records when the decoder call starts."""

            def __init__(self, inner):
                self.inner = inner

            def fork(self):
                return Stamped(self.inner.fork())

            def set_image(self, img):
                self.inner.set_image(img)

            def predict(self, *a, **k):
                stamps.append(time.perf_counter())
                return self.inner.predict(*a, **k)

        flow = XFlow(ScriptedPolicy(), None, Stamped(seg))
        hits = cache.stats.hits

        def after(request_image: np.ndarray) -> float:
            start = time.perf_counter()
            flow.revise(request_image, clicks, box=box)
            return stamps[-1] - start

        before_s, after_s = [], []
        for _ in range(args.repeats):  # interleaved, so both see the same load
            before_s.append(before(image.copy()))
            after_s.append(after(image.copy()))
        if cache.stats.misses != 1 or cache.stats.hits - hits < args.repeats:
            raise RuntimeError(f"the after path did not hit the cache: {cache.stats}")

    b_ms, a_ms = 1000 * statistics.median(before_s), 1000 * statistics.median(after_s)
    print(f"cached click on a {args.height} x {args.width} image, median of {args.repeats} requests:")
    print(f"  before (main 266e3f9's steps): {b_ms:.3g} ms from the loaded image to the decoder call")
    print(f"  after  (XFlow.revise now):     {a_ms:.3g} ms from the loaded image to the decoder call")
    print(f"  before / after = {b_ms / a_ms:.2f}x")
    per_image_costs(image, max(1, args.repeats // 4))
    return 0


def per_image_costs(image: np.ndarray, repeats: int) -> None:
    """Stage 1 prompts of "all findings" and a trace mask's RLE, before and after (module docstring)."""
    from monailabel_xflow import rle
    from monailabel_xflow.geometry import check_image
    from monailabel_xflow.instructions import all_findings
    from monailabel_xflow.policy.configs import build_processor
    from monailabel_xflow.policy.conversation import ConversationEncoder

    encoder = ConversationEncoder(build_processor("tiny"))
    checked, findings = check_image(image), all_findings()
    one_by_one = median_ms(lambda: [encoder.stage1_prompt(checked, i) for i in findings], repeats)
    together = median_ms(lambda: encoder.stage1_prompts(checked, findings), repeats)
    print(f"all findings, Stage 1 prompts: {one_by_one:.3g} ms one by one, {together:.3g} ms prepared once")
    h, w = image.shape
    rows, cols = np.ogrid[:h, :w]
    mask = ((rows - h / 2) / (h / 4)) ** 2 + ((cols - w / 3) / (w / 6)) ** 2 < 1
    encoded = median_ms(lambda: rle.encode(mask), repeats)
    deferred = median_ms(lambda: rle.LazyRLE(mask), repeats)
    print(f"a trace mask per Stage 2 turn: {encoded:.3g} ms rle.encode, {deferred:.3g} ms rle.LazyRLE")


def _after_key(image: np.ndarray) -> str:
    from monailabel_xflow.geometry import check_image
    from monailabel_xflow.segmenter.base import image_key

    return image_key(check_image(image))


if __name__ == "__main__":
    sys.exit(main())
