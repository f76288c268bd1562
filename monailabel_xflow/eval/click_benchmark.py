"""Click efficiency of F_seg on phantoms, as interactive segmentation reports it (``xflow benchmark clicks``).

Every lesion component of a set of phantoms is segmented by a simulated user who clicks up to
``K`` times, and the IoU with the component is recorded after ``k = 0 .. K`` clicks:

* **the user**: the project's own simulated user, :meth:`OracleClicker.next_click
  <monailabel_xflow.policy.oracle.OracleClicker.next_click>` (a positive click at the deepest
  pixel of the missed region, or a negative one at the deepest pixel of the over-segmented region,
  whichever is deeper; same-polarity clicks kept ``min_click_distance_px`` apart), asked on every
  method's *own* current mask, so each method gets the clicks its own errors call for;
* **F_seg** (``fseg``) runs through the one Stage 2 loop,
  :func:`~monailabel_xflow.workflow.revision.revise_mask`: each call passes the box (grown by a
  positive click outside it, :func:`~monailabel_xflow.geometry.grow_box`), every click so far and
  the previous call's ``low_res_logits``, exactly as Stage 2 does, pruning included
  (``prune``, as inference prunes);
* **anchors**, seeded by the same user: scikit-image's random walker (``random-walker``,
  Grady 2006) and marker-controlled watershed on the Sobel gradient (``watershed``), both with
  foreground seeds at the positive clicks and background seeds at the negative clicks and outside
  the box (seed disks of 1 % of the image side; the walker's ``beta`` chosen on dev,
  :data:`RANDOM_WALKER_BETA`).

Two prompts: ``box`` (the component's true, tight box at ``k = 0``, then clicks) and ``clicks``
(no box: ``k = 0`` is the empty mask; the first click, always positive, makes the box the point
it lies on, which later positive clicks grow, the click tool's rule for a person's clicks without
a box, :meth:`XFlow.revise <monailabel_xflow.workflow.xflow.XFlow.revise>`; the anchors take
everything outside RITM's zoom-in window, around the clicks and their current mask, expanded
1.4x, as background, :func:`zoom_window`). A third prompt, ``client``, is what a 3D Slicer or
OHIF user gets from the ``xflow_revise`` tool: each request carries every click so far and no
mask, and the click tool's rule answers it with one F_seg call
(:func:`~monailabel_xflow.workflow.xflow.client_session`: the box of the positive clicks, no
previous logits, no pruning); the anchors do not take it (they hold no state, so it would repeat
``clicks``). A seeded algorithm has nothing to grow from before its first positive click: its
``k = 0`` answer is the empty mask under either prompt (so the user's first click on it is the
positive one at the component's deepest pixel).

Figures (:func:`summarise`), each with a bootstrap 95 % interval over phantoms
(:mod:`monailabel_xflow.eval.bootstrap`: whole phantoms are resampled): mean IoU after ``k``
clicks, ``NoC@80/85/90`` (the number of clicks after which IoU first reaches the threshold;
``K + 1`` when it never does, the cap stated with the figure, as in RITM and SimpleClick), the
share of components that reach each threshold within ``K`` clicks, and the gain
``IoU@K - IoU@0``; overall, per finding and per lesion size (:data:`SIZE_BINS`, the component's
share of the image). A user who has no admissible click left stops; the IoU stays where it is.

**Protocol**: choices are made on the dev seed (:data:`DEV_SEED`); the test seed
(:data:`TEST_SEED`, drawn once with ``secrets.randbelow(10**6)`` when this module was written and
never used for a choice) is scored once, for the report. ``OUT/manifest.json`` records the split,
seed, phantom size, ``K``, the user's settings, the methods and a content hash of F_seg's weights;
a rerun into an ``OUT`` made otherwise is refused (a rerun may ask for more or fewer phantoms: the
set's first ``n`` are the same whatever ``n``). ``OUT/results.jsonl`` holds one line per
(component, method, prompt), appended as soon as it is computed: an interrupted run continues where
it stopped and never redoes a finished line.

Heavy imports (torch, transformers, matplotlib) happen inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import MIN_COMPONENT_PX, Box, Click, connected_components, grow_box, mask_to_box
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.policy.oracle import MIN_CLICK_DISTANCE_PX, OracleClicker, simulated_user
from monailabel_xflow.segmenter.base import PromptableSegmenter
from monailabel_xflow.segmenter.refine import refinement_for
from monailabel_xflow.vocabulary import FINDINGS
from monailabel_xflow.workflow.revision import oracle_session
from monailabel_xflow.workflow.xflow import client_session

__all__ = [
    "ClickBenchmarkError",
    "DEV_SEED",
    "TEST_SEED",
    "SPENT_TEST_SEEDS",
    "PROMPTS",
    "ANCHORS",
    "THRESHOLDS",
    "SIZE_BINS",
    "MAX_CLICKS",
    "Component",
    "phantom_components",
    "size_bin",
    "noc",
    "fseg_curve",
    "anchor_curve",
    "anchor_mask",
    "check_manifest",
    "run_click_benchmark",
    "summarise",
    "write_summary",
    "render_markdown",
    "render_table",
    "plot_curve",
    "make_clicker",
    "segmenter_identity",
    "iter_records",
    "METHODS",
]

log = logging.getLogger(__name__)

DEV_SEED = 1000
"""The seed every choice is made on (the phantom benchmark's dev seed; the demo trains on seed 0)."""

TEST_SEED = 215497
"""The click benchmark's test seed: drawn once (``secrets.randbelow(10**6)``, 2026-12-04, after
410321 was spent and before any later F_seg or refinement choice), to be scored once, for a report."""

SPENT_TEST_SEEDS = (991848, 410321)
"""Earlier test seeds, each scored once (991848: the interactive F_seg of ``reports/click-efficiency/test``;
410321: the click refinement of ``reports/click-efficiency/test-410321``); never a seed for a choice again."""

SPLITS = {"dev": DEV_SEED, "test": TEST_SEED}

PROMPTS = ("box", "clicks", "client")
"""``box``: the true box, then clicks; ``clicks``: clicks only, Stage 2's loop; ``client``: clicks
only, each request as 3D Slicer and OHIF send it (every click so far, no mask; F_seg only)."""

ANCHOR_PROMPTS = ("box", "clicks")
"""The prompts the anchors answer (a seeded algorithm holds no state: ``client`` would be ``clicks``)."""

ANCHORS = ("random-walker", "watershed")
"""Classical interactive algorithms seeded by the same simulated user (scikit-image)."""

METHODS = ("fseg",) + ANCHORS

METHOD_TITLES = {
    "fseg": "F_seg",
    "random-walker": "random walker (scikit-image)",
    "watershed": "marker watershed (scikit-image)",
}

PROMPT_TITLES = {"box": "true box + clicks", "clicks": "clicks only", "client": "clicks as Slicer/OHIF send them"}

THRESHOLDS = (0.80, 0.85, 0.90)
"""The NoC thresholds of the literature."""

MAX_CLICKS = 8
"""Default ``K``: the IoU curve runs over ``k = 0 .. K``; NoC counts a component never reaching
the threshold as ``K + 1``."""

SIZE_BINS = (("small", 0.0, 0.005), ("medium", 0.005, 0.02), ("large", 0.02, 1.01))
"""Lesion size by the component's share of the image's pixels: below 0.5 %, 0.5-2 %, 2 % and up
(at 256 px: below about 18 x 18 px, 18-36 px across, larger)."""

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "xflow-click-benchmark/1"
RESULTS_NAME = "results.jsonl"
PHANTOM_DIR = "phantoms"
SUMMARY_JSON = "clicks.json"
SUMMARY_MD = "clicks.md"
CURVE_PNG = "curve.png"
BOOTSTRAP_REPLICATES = 2000
BOOTSTRAP_SEED = 0


class ClickBenchmarkError(InputError):
    """A benchmark that cannot run as asked: bad arguments, or an ``OUT`` made for another run."""


# --- the phantoms' components -----------------------------------------------------------------


@dataclass
class Component:
    """One connected lesion component of one phantom.

    Attributes:
        key: ``"<phantom>/<lesion>/<component>"``, stable for a given seed and size.
        phantom: the phantom's index in the set (the bootstrap's group).
        finding: the lesion's finding.
        mask: bool ``(H, W)`` ground truth.
        area: the component's share of the image's pixels.
    """

    key: str
    phantom: int
    finding: str
    mask: np.ndarray
    area: float

    @property
    def size(self) -> str:
        return size_bin(self.area)


def size_bin(area: float) -> str:
    """The :data:`SIZE_BINS` name of a component covering ``area`` of the image."""
    for name, lo, hi in SIZE_BINS:
        if lo <= area < hi:
            return name
    raise ClickBenchmarkError(f"area share {area} is outside [0, 1]")


def phantom_components(
    seed: int, index: int, size: int, folder: Path | None = None
) -> tuple[np.ndarray, list[Component]]:
    """The image and lesion components of phantom ``index`` of the set drawn with ``seed``.

    The phantom is the one ``xflow phantom`` exports at that index
    (:func:`~monailabel_xflow.data.export.image_seed`, :func:`~monailabel_xflow.data.export.scheduled_findings`);
    the image is its 8-bit PNG read back through the loader the models are trained through
    (:func:`~monailabel_xflow.transforms.load_cxr`), written to ``folder`` (kept, for looking at)
    or to a temporary file.

    Returns:
        ``(image, components)``: ``(H, W)`` float32 in ``[0, 1]``; every 8-connected component of
        every lesion with at least :data:`~monailabel_xflow.geometry.MIN_COMPONENT_PX` pixels.
    """
    import tempfile

    from PIL import Image

    from monailabel_xflow.data.export import image_seed, quantize, scheduled_findings
    from monailabel_xflow.data.phantom import generate_phantom
    from monailabel_xflow.transforms import load_cxr

    s = image_seed(seed, index)
    phantom = generate_phantom(s, size=size, findings=scheduled_findings(index, np.random.default_rng(s)))
    _, v8 = quantize(phantom.image)
    with tempfile.TemporaryDirectory() as tmp:
        target = (folder or Path(tmp)) / f"phantom_{seed}_{index:05d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(v8).save(target)
        image, _ = load_cxr(target)
    components = []
    pixels = float(size * size)
    for k, lesion in enumerate(phantom.lesions):
        for c, comp in enumerate(connected_components(lesion.mask, MIN_COMPONENT_PX)):
            key = f"{index:05d}/{k}/{c}"
            components.append(Component(key, index, lesion.finding, comp, float(comp.sum()) / pixels))
    return image, components


# --- one component, one method -----------------------------------------------------------------


def _forward(ious: list[float], clicks: int) -> list[float]:
    """The curve over ``k = 0 .. clicks``: a user who stopped leaves the IoU where it was."""
    return (ious + [ious[-1]] * (clicks + 1 - len(ious)))[: clicks + 1]


def make_clicker(max_clicks: int = MAX_CLICKS, min_click_distance_px: float = MIN_CLICK_DISTANCE_PX) -> OracleClicker:
    """The simulated user of the benchmark (:func:`~monailabel_xflow.policy.oracle.simulated_user`)."""
    return simulated_user(max_clicks, min_click_distance_px)


def fseg_curve(
    segmenter: PromptableSegmenter,
    gt: np.ndarray,
    prompt: str,
    clicker: OracleClicker,
    prune: bool = True,
    image: np.ndarray | None = None,
) -> dict[str, Any]:
    """F_seg's IoU after ``k = 0 .. K`` clicks on one component (the segmenter holds the image).

    Args:
        segmenter: F_seg, ``set_image`` already called.
        gt: ``(H, W)`` bool ground-truth component.
        prompt: ``"box"``, ``"clicks"`` or ``"client"`` (module docstring).
        clicker: the simulated user (:func:`make_clicker`); its ``max_clicks`` is ``K``.
        prune: prune as Stage 2 does (:func:`~monailabel_xflow.workflow.revision.keep_connected_to`).
        image: the image the segmenter holds; needed by ``"client"``, whose every request sets it.

    Returns:
        ``{"ious": [K + 1 floats], "clicks": [[positive, x, y], ...]}``.
    """
    k_max = clicker.max_clicks
    gt = np.asarray(gt, bool)
    if prompt == "box":
        box = mask_to_box(gt)
        assert box is not None
        ious, clicks = oracle_session(segmenter, gt, clicker, box, prune=prune)
    elif prompt == "clicks":
        first = clicker.next_click(np.zeros_like(gt), gt, ())
        if first is None or k_max == 0:
            return {"ious": _forward([0.0], k_max), "clicks": []}
        # nothing asked yet at k = 0: the empty mask; the first click's point is the box
        box = (first.x, first.y, first.x, first.y)
        ious, clicks = oracle_session(segmenter, gt, clicker, box, [first], prune=prune)
        ious = [0.0] + ious
    elif prompt == "client":
        if image is None:
            raise ClickBenchmarkError("the client prompt needs the image (the click tool sets it per request)")
        ious, clicks = client_session(segmenter, image, gt, clicker)
        ious = [0.0] + ious  # nothing asked yet at k = 0: the empty mask
    else:
        raise ClickBenchmarkError(f"prompt must be one of {PROMPTS}, got {prompt!r}")
    return {"ious": _forward(ious, k_max), "clicks": [[c.positive, c.x, c.y] for c in clicks]}


def _seed_disks(shape: Sequence[int], clicks: Sequence[Click], radius: int) -> tuple[np.ndarray, np.ndarray]:
    """Positive and negative seed masks: a disk of ``radius`` px around each click."""
    from monailabel_xflow.geometry import point_to_pixel

    h, w = int(shape[0]), int(shape[1])
    rr, cc = np.ogrid[:h, :w]
    pos, neg = np.zeros((h, w), bool), np.zeros((h, w), bool)
    for c in clicks:
        r, col = point_to_pixel(c.x, c.y, (h, w))
        disk = (rr - r) ** 2 + (cc - col) ** 2 <= radius**2
        (pos if c.positive else neg)[disk] = True
    return pos, neg


RANDOM_WALKER_BETA = 5000.0
"""The random walker's edge penalty, chosen on the dev seed (phantoms 2-5, true box + 4 clicks,
mean IoU@4: scikit-image's default 130 -> 0.46, 2000 -> 0.61, 5000 -> 0.65, 10000 -> 0.62,
20000 -> 0.57): phantom lesions differ from lung by little contrast."""


ZOOM_EXPAND = 1.4
"""RITM's Zoom-In expansion of the window around the clicks and the current mask."""


def zoom_window(shape: Sequence[int], clicks: Sequence[Click], previous: np.ndarray | None = None) -> np.ndarray:
    """The window an anchor segments in without a box: RITM's Zoom-In (Sofiiuk et al. 2022).

    The bounding box of the positive clicks and the current mask, expanded by :data:`ZOOM_EXPAND`
    about its centre, at least a quarter of the image's shorter side, clipped to the image, one
    pixel in from the border (everything outside is background).

    Returns:
        ``(H, W)`` bool window.
    """
    from monailabel_xflow.geometry import point_to_pixel

    h, w = int(shape[0]), int(shape[1])
    pts = [point_to_pixel(c.x, c.y, (h, w)) for c in clicks if c.positive]
    if previous is not None and np.asarray(previous).any():
        rows, cols = np.flatnonzero(np.asarray(previous).any(1)), np.flatnonzero(np.asarray(previous).any(0))
        pts += [(int(rows[0]), int(cols[0])), (int(rows[-1]), int(cols[-1]))]
    window = np.zeros((h, w), bool)
    if not pts:
        return window
    rs, cs = [p[0] for p in pts], [p[1] for p in pts]
    least = min(h, w) / 4
    half_r = max((max(rs) - min(rs) + 1) * ZOOM_EXPAND, least) / 2
    half_c = max((max(cs) - min(cs) + 1) * ZOOM_EXPAND, least) / 2
    cr, cc = (max(rs) + min(rs)) / 2, (max(cs) + min(cs)) / 2
    r0, r1 = max(1, int(cr - half_r)), min(h - 1, int(np.ceil(cr + half_r)) + 1)
    c0, c1 = max(1, int(cc - half_c)), min(w - 1, int(np.ceil(cc + half_c)) + 1)
    window[r0:r1, c0:c1] = True
    return window


def anchor_mask(
    method: str,
    image: np.ndarray,
    box: Box | None,
    clicks: Sequence[Click],
    radius: int | None = None,
    beta: float = RANDOM_WALKER_BETA,
    previous: np.ndarray | None = None,
) -> np.ndarray:
    """One classical interactive segmentation from click seeds (see the module docstring).

    Args:
        method: ``"random-walker"`` or ``"watershed"``.
        image: ``(H, W)`` float in ``[0, 1]``.
        box: the normalised box (its outside is background), or None (outside the
            :func:`zoom_window` of the clicks and ``previous`` is).
        clicks: the clicks so far; positive ones seed the foreground, negative ones the background.
        radius: seed disk radius in pixels (default: 1 % of the shorter side, at least 1).
        beta: the random walker's edge penalty.
        previous: the anchor's current mask (widens the zoom window without a box).

    Returns:
        ``(H, W)`` bool mask; empty when no positive click seeds the foreground.

    Raises:
        ClickBenchmarkError: an unknown method.
    """
    from skimage.filters import sobel
    from skimage.segmentation import random_walker, watershed

    from monailabel_xflow.geometry import box_to_mask

    if method not in ANCHORS:
        raise ClickBenchmarkError(f"anchor must be one of {ANCHORS}, got {method!r}")
    image = np.asarray(image, np.float64)
    h, w = image.shape
    radius = radius if radius is not None else max(1, round(min(h, w) / 100))
    pos, neg = _seed_disks((h, w), clicks, radius)
    if not pos.any():
        return np.zeros((h, w), bool)
    if box is not None:
        inside = box_to_mask(box, (h, w))
    else:
        inside = zoom_window((h, w), clicks, previous)
    inside |= pos  # a positive click is never background
    markers = np.zeros((h, w), np.int32)
    markers[~inside | neg] = 2
    markers[pos] = 1  # positive wins where disks overlap
    # work on the crop the unknown pixels span (plus a ring of known ones): the rest is decided
    rows, cols = np.flatnonzero((markers != 2).any(1)), np.flatnonzero((markers != 2).any(0))
    r0, r1 = max(0, rows[0] - 1), min(h, rows[-1] + 2)
    c0, c1 = max(0, cols[0] - 1), min(w, cols[-1] + 2)
    sub_img, sub_mk = image[r0:r1, c0:c1], markers[r0:r1, c0:c1]
    if not (sub_mk == 2).any():  # nothing is background: every unknown pixel is foreground
        labels = np.ones_like(sub_mk)
    elif method == "random-walker":
        labels = random_walker(sub_img, sub_mk, beta=beta, mode="bf")  # direct solve: the fastest here
    else:
        labels = watershed(sobel(sub_img), sub_mk)
    out = np.zeros((h, w), bool)
    out[r0:r1, c0:c1] = labels == 1
    return out


def anchor_curve(method: str, image: np.ndarray, gt: np.ndarray, prompt: str, clicker: OracleClicker) -> dict[str, Any]:
    """An anchor's IoU after ``k = 0 .. K`` clicks of the same user on one component.

    The box grows as in Stage 2 (a positive click outside it); with ``prompt == "clicks"`` the
    first click makes the box the point it lies on, as for F_seg, but the anchor's background is
    the outside of its :func:`zoom_window` (a point box would leave no unknown pixel).

    Returns:
        ``{"ious": [K + 1 floats], "clicks": [[positive, x, y], ...]}``.
    """
    if prompt not in ANCHOR_PROMPTS:
        raise ClickBenchmarkError(f"an anchor's prompt must be one of {ANCHOR_PROMPTS}, got {prompt!r}")
    gt = np.asarray(gt, bool)
    box: Box | None = mask_to_box(gt) if prompt == "box" else None
    clicks: list[Click] = []
    mask = np.zeros_like(gt)  # no positive seed yet: nothing to grow from
    ious = [mask_iou(mask, gt)]
    for _ in range(clicker.max_clicks):
        click = clicker.next_click(mask, gt, clicks)
        if click is None:
            break
        clicks.append(click)
        if box is not None:
            box = grow_box(box, click)
        mask = anchor_mask(method, image, box, clicks, previous=mask)
        ious.append(mask_iou(mask, gt))
        if ious[-1] >= 1.0:
            break
    return {"ious": _forward(ious, clicker.max_clicks), "clicks": [[c.positive, c.x, c.y] for c in clicks]}


def noc(ious: Sequence[float], threshold: float) -> int:
    """Number of clicks to reach ``threshold``: the first ``k`` with ``ious[k] >= threshold``,
    ``len(ious)`` (= ``K + 1``) when none does. ``ious[0]`` is the IoU before any click."""
    for k, v in enumerate(ious):
        if v >= threshold:
            return k
    return len(ious)


# --- the run ------------------------------------------------------------------------------------


def segmenter_identity(path: str | Path) -> str:
    """A content hash of F_seg's weights (file names and bytes; a hub id enters as its text)."""
    digest = hashlib.sha256()
    p = Path(path)
    if not p.exists():
        digest.update(f"hub:{path}".encode())
        return digest.hexdigest()[:16]
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix != ".md") if p.is_dir() else [p]
    for f in files:
        digest.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


UNGUARDED = ("created", "phantoms")
"""Manifest fields a rerun may change: the set's first ``n`` phantoms are the same whatever ``n``,
so a rerun may score more of them (or summarise fewer) in the same ``OUT``."""


def check_manifest(out: Path, wanted: Mapping[str, Any]) -> dict[str, Any]:
    """Refuse an ``out`` made for another benchmark; return the manifest to write.

    An ``out`` whose manifest differs in any recorded field but :data:`UNGUARDED` (split, seed,
    size, K, the user's settings, methods, prompts, the anchors' settings, F_seg's identity) is
    refused: its lines were scored on other components or by another model. An ``out`` holding
    results but no manifest is refused too.

    Raises:
        ClickBenchmarkError: naming the fields that differ.
    """
    path = out / MANIFEST_NAME
    if not path.is_file():
        if (out / RESULTS_NAME).exists():
            raise ClickBenchmarkError(f"{out} holds {RESULTS_NAME} but no {MANIFEST_NAME}: use another --out")
        return dict(wanted)
    try:
        have = json.loads(path.read_text())
    except ValueError as err:
        raise ClickBenchmarkError(f"{path} is not readable JSON: {err}") from err
    differ = sorted(k for k in wanted if k not in UNGUARDED and have.get(k) != wanted[k])
    if differ:
        detail = ", ".join(f"{k}: {have.get(k)!r} there, {wanted[k]!r} now" for k in differ)
        raise ClickBenchmarkError(f"{out} was made for another click benchmark ({detail}); use another --out")
    return {**wanted, "created": have.get("created", wanted.get("created"))}


def _done(out: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Finished lines of ``results.jsonl`` by ``(component, method, prompt)`` (a torn last line is skipped)."""
    done: dict[tuple[str, str, str], dict[str, Any]] = {}
    path = out / RESULTS_NAME
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
                done[(r["component"], r["method"], r["prompt"])] = r
            except (ValueError, KeyError, TypeError):
                continue
    return done


def run_click_benchmark(
    out: str | Path,
    segmenter: str | Path | None,
    *,
    split: str = "dev",
    seed: int | None = None,
    phantoms: int = 40,
    size: int = 256,
    max_clicks: int = MAX_CLICKS,
    min_click_distance_px: float = MIN_CLICK_DISTANCE_PX,
    methods: Sequence[str] = METHODS,
    prompts: Sequence[str] = PROMPTS,
    prune: bool = True,
    backend: str = "transformers",
    device: str | None = None,
    click_refinement: str = "none",
    progress: bool = True,
    plots: bool = True,
    load: Callable[[], PromptableSegmenter] | None = None,
) -> dict[str, Any]:
    """Score every component of ``phantoms`` phantoms; write ``OUT/results.jsonl`` and the summary.

    Args:
        out: the benchmark folder (resumed if it holds this benchmark, see :func:`check_manifest`).
        segmenter: F_seg's weights (folder, ``.pt`` file or hub id); None only with ``load`` or
            when ``fseg`` is not among ``methods``.
        split: ``"dev"`` (choices) or ``"test"`` (the report, once).
        seed: phantom seed; default the split's (:data:`DEV_SEED`, :data:`TEST_SEED`).
        phantoms: how many phantoms (1..10000).
        size: phantom side in pixels (128..1024).
        max_clicks: ``K`` (1..16, the project's click limit).
        min_click_distance_px: the user's same-polarity exclusion radius.
        methods: subset of ``fseg``, ``random-walker``, ``watershed``.
        prompts: subset of ``box``, ``clicks``.
        prune: F_seg's masks pruned as Stage 2 prunes.
        backend, device: how F_seg is loaded (:func:`~monailabel_xflow.segmenter.loading.load_segmenter`).
        click_refinement: ``"none"`` or ``"brs"`` (:func:`~monailabel_xflow.segmenter.refine.refinement_for`);
            part of the F_seg's identity in the manifest.
        progress: a progress bar over phantoms (and a log line per phantom).
        plots: write ``OUT/curve.png``.
        load: builds F_seg instead of loading ``segmenter`` (tests); its identity is then the
            text of ``segmenter``.

    Returns:
        The summary (:func:`summarise`), also written to ``OUT/clicks.json`` and ``OUT/clicks.md``.

    Raises:
        ClickBenchmarkError: bad arguments or an ``out`` made for another benchmark.
    """
    from tqdm.auto import tqdm

    if split not in SPLITS:
        raise ClickBenchmarkError(f"split must be 'dev' or 'test', got {split!r}")
    seed = SPLITS[split] if seed is None else int(seed)
    if split == "test" and seed != TEST_SEED:
        raise ClickBenchmarkError(f"the test split is seed {TEST_SEED}; use --seed only on dev")
    if split == "dev" and seed in (TEST_SEED, *SPENT_TEST_SEEDS):
        raise ClickBenchmarkError(f"seed {seed} is a test seed; dev choices are made on other seeds")
    if not 1 <= int(phantoms) <= 10000:
        raise ClickBenchmarkError(f"phantoms must lie in 1..10000, got {phantoms}")
    if not 128 <= int(size) <= 1024:
        raise ClickBenchmarkError(f"size must lie in 128..1024 px, got {size}")
    if not 1 <= int(max_clicks) <= 16:
        raise ClickBenchmarkError(f"max_clicks must lie in 1..16, got {max_clicks}")
    if not 0 <= float(min_click_distance_px) <= size:
        raise ClickBenchmarkError(f"min_click_distance_px must lie in 0..{size}, got {min_click_distance_px}")
    bad = [m for m in methods if m not in METHODS] + [p for p in prompts if p not in PROMPTS]
    if bad or not methods or not prompts:
        raise ClickBenchmarkError(f"unknown or no methods/prompts {bad}; methods {METHODS}, prompts {PROMPTS}")
    methods = [m for m in METHODS if m in methods]
    prompts = [p for p in PROMPTS if p in prompts]
    try:
        refinement = refinement_for(click_refinement)
    except ValueError as err:
        raise ClickBenchmarkError(str(err)) from err
    if "fseg" in methods and segmenter is None and load is None:
        raise ClickBenchmarkError("F_seg is among the methods but no segmenter was given")

    out = Path(out)
    identity = None
    if "fseg" in methods:
        identity = segmenter_identity(segmenter) if load is None and segmenter is not None else str(segmenter)
    manifest = check_manifest(
        out,
        {
            "format": MANIFEST_FORMAT,
            "split": split,
            "seed": seed,
            "dev_seed": DEV_SEED,
            "test_seed": TEST_SEED,
            "phantoms": int(phantoms),
            "size": int(size),
            "max_clicks": int(max_clicks),
            "user": {
                "min_click_distance_px": float(min_click_distance_px),
                "tau": 1.0,
                "rule": "OracleClicker.next_click",
            },
            "methods": list(methods),
            "prompts": list(prompts),
            "prune": bool(prune),
            "anchors": {
                "random_walker_beta": RANDOM_WALKER_BETA,
                "seed_radius": "1 % of the shorter side",
                "clicks_only_window": f"zoom-in x{ZOOM_EXPAND}, at least 1/4 of the shorter side",
            },
            "segmenter": None
            if identity is None
            else {
                "weights": str(segmenter),
                "identity": identity,
                **({"click_refinement": click_refinement} if refinement is not None else {}),
            },
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    # F_seg is loaded before the folder is made: weights that fail to load leave no manifest
    # behind to refuse the corrected rerun.
    seg: PromptableSegmenter | None = None
    if "fseg" in methods:
        if load is not None:
            seg = load()
        else:
            from monailabel_xflow.segmenter.loading import load_segmenter

            seg = load_segmenter(str(segmenter), backend=backend, device=device, refinement=refinement)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")

    clicker = make_clicker(int(max_clicks), float(min_click_distance_px))
    done = _done(out)
    results = out / RESULTS_NAME
    bar = tqdm(range(int(phantoms)), desc=f"click benchmark ({split})", disable=not progress)
    with results.open("a") as sink:
        for index in bar:
            image, components = phantom_components(seed, index, int(size), out / PHANTOM_DIR)
            todo = [
                (c, m, p)
                for c in components
                for m in methods
                for p in prompts
                if (c.key, m, p) not in done and (m == "fseg" or p in ANCHOR_PROMPTS)
            ]
            if not todo:
                continue
            start = time.perf_counter()
            if seg is not None and any(m == "fseg" for _, m, _ in todo):
                seg.set_image(image)
            for comp, method, prompt in todo:
                tick = time.perf_counter()
                if method == "fseg":
                    assert seg is not None
                    curve = fseg_curve(seg, comp.mask, prompt, clicker, prune, image=image)
                else:
                    curve = anchor_curve(method, image, comp.mask, prompt, clicker)
                record = {
                    "component": comp.key,
                    "phantom": comp.phantom,
                    "finding": comp.finding,
                    "area": comp.area,
                    "size": comp.size,
                    "method": method,
                    "prompt": prompt,
                    "ious": [round(float(v), 6) for v in curve["ious"]],
                    "clicks": curve["clicks"],
                    "seconds": round(time.perf_counter() - tick, 4),
                }
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                done[(comp.key, method, prompt)] = record
            log.info(
                "phantom %d: %d component(s) x %d method-prompt(s) in %.1f s",
                index,
                len(components),
                len(todo) // max(1, len(components)),
                time.perf_counter() - start,
            )
    keys = {(c, m, p) for (c, m, p) in done if m in methods and p in prompts and done[(c, m, p)]["phantom"] < phantoms}
    records = [done[k] for k in sorted(keys)]
    summary = summarise(records, int(max_clicks))
    summary["protocol"] = {k: manifest[k] for k in ("split", "seed", "dev_seed", "test_seed", "phantoms", "size")}
    summary["manifest"] = manifest
    write_summary(out, summary, plots=plots)
    return summary


# --- figures ------------------------------------------------------------------------------------


def _ci(values: np.ndarray, point: float) -> dict[str, float | None]:
    from monailabel_xflow.eval.bootstrap import interval

    return interval(values, point)


def _figures(ious: np.ndarray, w: np.ndarray) -> dict[str, np.ndarray]:
    """Every figure of one (method, prompt) under each row of weights ``w`` (``(B, n)``)."""
    k_max = ious.shape[1] - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        total = w.sum(1)
        out = {f"iou@{k}": (w * ious[:, k]).sum(1) / total for k in range(k_max + 1)}
        for t in THRESHOLDS:
            nocs = np.array([noc(row, t) for row in ious], float)
            out[f"noc@{round(t * 100)}"] = (w * nocs).sum(1) / total
            out[f"reached@{round(t * 100)}"] = (w * (nocs <= k_max)).sum(1) / total
        out["gain"] = (w * (ious[:, k_max] - ious[:, 0])).sum(1) / total
    return out


def _table(records: Sequence[Mapping[str, Any]], weights: np.ndarray, index: Mapping[str, int]) -> dict[str, Any]:
    ious = np.array([r["ious"] for r in records], float)
    cols = np.array([index[r["component"]] for r in records], int)
    point = _figures(ious, np.ones((1, len(records))))
    boot = _figures(ious, weights[:, cols])
    return {
        "n": len(records),
        "phantoms": len({r["phantom"] for r in records}),
        "figures": {k: _ci(boot[k], float(point[k][0])) for k in point},
    }


def summarise(records: Sequence[Mapping[str, Any]], max_clicks: int) -> dict[str, Any]:
    """The benchmark's figures, with bootstrap 95 % intervals over phantoms.

    Args:
        records: ``results.jsonl`` lines (``component``, ``phantom``, ``finding``, ``size``,
            ``method``, ``prompt``, ``ious`` of length ``max_clicks + 1``).
        max_clicks: ``K``.

    Returns:
        ``{"max_clicks", "noc_cap", "components", "rows": {"<method>|<prompt>": table},
        "by_finding": {row: {finding: table}}, "by_size": {row: {bin: table}}}``; a table is
        ``{"n", "phantoms", "figures": {"iou@k", "noc@80", "reached@80", ..., "gain": interval}}``.
        Every row and subset is resampled with the same phantom draws, so two rows' figures are
        comparable replicate by replicate.

    Raises:
        ClickBenchmarkError: a record whose curve is not ``max_clicks + 1`` long.
    """
    from monailabel_xflow.eval.bootstrap import resample_weights

    for r in records:
        if len(r["ious"]) != max_clicks + 1:
            raise ClickBenchmarkError(f"record {r['component']} has {len(r['ious'])} IoUs, expected {max_clicks + 1}")
    components = sorted({r["component"] for r in records})
    index = {c: i for i, c in enumerate(components)}
    phantom_of = {r["component"]: r["phantom"] for r in records}
    groups = {p: i for i, p in enumerate(sorted(set(phantom_of.values())))}
    group = np.array([groups[phantom_of[c]] for c in components], int)
    weights = resample_weights(group, BOOTSTRAP_REPLICATES, BOOTSTRAP_SEED) if len(components) else np.zeros((1, 0))
    rows: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        rows.setdefault(f"{r['method']}|{r['prompt']}", []).append(r)
    order = [f"{m}|{p}" for p in PROMPTS for m in METHODS if f"{m}|{p}" in rows]
    summary: dict[str, Any] = {
        "max_clicks": max_clicks,
        "noc_cap": max_clicks + 1,
        "thresholds": list(THRESHOLDS),
        "components": len(components),
        "phantoms": len(groups),
        "bootstrap": {"replicates": BOOTSTRAP_REPLICATES, "seed": BOOTSTRAP_SEED, "over": "phantoms"},
        "rows": {},
        "by_finding": {},
        "by_size": {},
    }
    for row in order:
        rs = rows[row]
        summary["rows"][row] = _table(rs, weights, index)
        summary["by_finding"][row] = {
            f: _table([r for r in rs if r["finding"] == f], weights, index)
            for f in FINDINGS
            if any(r["finding"] == f for r in rs)
        }
        summary["by_size"][row] = {
            b: _table([r for r in rs if r["size"] == b], weights, index)
            for b, _, _ in SIZE_BINS
            if any(r["size"] == b for r in rs)
        }
    return summary


def _fmt(c: Mapping[str, Any] | None, digits: int = 2) -> str:
    if not c or c.get("value") is None:
        return "—"
    v = f"{c['value']:.{digits}f}"
    return v if c.get("low") is None else f"{v} [{c['low']:.{digits}f}, {c['high']:.{digits}f}]"


def _row_title(row: str) -> str:
    method, prompt = row.split("|")
    return f"{METHOD_TITLES.get(method, method)}, {PROMPT_TITLES.get(prompt, prompt)}"


def _ks(max_clicks: int) -> list[int]:
    return [k for k in (0, 1, 2, 3, 4, 5, 8, 10, 12, 16) if k <= max_clicks]


def render_markdown(summary: Mapping[str, Any]) -> str:
    """``clicks.md``: the tables of :func:`summarise` (value [95 % interval over phantoms])."""
    k_max = summary["max_clicks"]
    ks = _ks(k_max)
    proto = summary.get("protocol", {})
    lines = [
        "# Click efficiency",
        "",
        f"Split **{proto.get('split', '?')}** (seed {proto.get('seed', '?')}; "
        f"dev seed {proto.get('dev_seed', DEV_SEED)}, test seed {proto.get('test_seed', TEST_SEED)}), "
        f"{summary['components']} lesion components of {summary['phantoms']} phantoms ({proto.get('size', '?')} px). "
        "Simulated user: `OracleClicker.next_click` on each "
        f"method's own mask, up to K = {k_max} clicks. NoC@t: clicks until IoU ≥ t, **{summary['noc_cap']} when never "
        "reached** (K + 1); reached@t: share of components reaching t within K clicks. Value [bootstrap 95 % interval "
        f"over phantoms, {summary['bootstrap']['replicates']} replicates].",
        "",
        "## Mean IoU after k clicks",
        "",
        "| method, prompt | n | " + " | ".join(f"k = {k}" for k in ks) + f" | IoU@{k_max} − IoU@0 |",
        "|---|---|" + "---|" * (len(ks) + 1),
    ]
    for row, t in summary["rows"].items():
        f = t["figures"]
        lines.append(
            f"| {_row_title(row)} | {t['n']} | "
            + " | ".join(_fmt(f[f"iou@{k}"]) for k in ks)
            + f" | {_fmt(f['gain'])} |"
        )
    lines += [
        "",
        f"## NoC (never = {summary['noc_cap']}) and share reaching the threshold within {k_max} clicks",
        "",
        "| method, prompt | "
        + " | ".join(f"NoC@{round(t * 100)}" for t in THRESHOLDS)
        + " | "
        + " | ".join(f"reached@{round(t * 100)}" for t in THRESHOLDS)
        + " |",
        "|---|" + "---|" * (2 * len(THRESHOLDS)),
    ]
    for row, t in summary["rows"].items():
        f = t["figures"]
        lines.append(
            f"| {_row_title(row)} | "
            + " | ".join(_fmt(f[f"noc@{round(x * 100)}"], 1) for x in THRESHOLDS)
            + " | "
            + " | ".join(_fmt(f[f"reached@{round(x * 100)}"]) for x in THRESHOLDS)
            + " |"
        )
    for title, key in (("finding", "by_finding"), ("lesion size", "by_size")):
        lines += [
            "",
            f"## By {title}: IoU@0, IoU@4, IoU@{k_max}, NoC@85",
            "",
            f"| method, prompt | {title} | n | IoU@0 | IoU@{min(4, k_max)} | IoU@{k_max} | NoC@85 |",
            "|---|---|---|---|---|---|---|",
        ]
        for row, parts in summary[key].items():
            for name, t in parts.items():
                f = t["figures"]
                lines.append(
                    f"| {_row_title(row)} | {name} | {t['n']} | {_fmt(f['iou@0'])} | {_fmt(f[f'iou@{min(4, k_max)}'])} "
                    f"| {_fmt(f[f'iou@{k_max}'])} | {_fmt(f['noc@85'], 1)} |"
                )
    lines += [
        "",
        f"Size bins (share of the image): {', '.join(f'{n} [{lo:g}, {hi:g})' for n, lo, hi in SIZE_BINS)}.",
        "",
    ]
    return "\n".join(lines)


def render_table(summary: Mapping[str, Any]) -> str:
    """A short plain-text table for the terminal: mean IoU at a few ``k`` and NoC@85 per row."""
    k_max = summary["max_clicks"]
    ks = _ks(k_max)
    proto = summary.get("protocol", {})
    head = (
        f"{proto.get('split', '?')} split, seed {proto.get('seed', '?')}: {summary['components']} components of "
        f"{summary['phantoms']} phantoms; mean IoU after k clicks, NoC@85 (never = {summary['noc_cap']})"
    )
    lines = [head, f"{'method, prompt':52s} " + " ".join(f"k={k:<4d}" for k in ks) + " NoC@85"]
    for row, t in summary["rows"].items():
        f = t["figures"]
        lines.append(
            f"{_row_title(row):52s} "
            + " ".join(f"{f[f'iou@{k}']['value']:.3f} " for k in ks)
            + f" {f['noc@85']['value']:.2f}"
        )
    return "\n".join(lines)


def plot_curve(summary: Mapping[str, Any], path: Path) -> Path:
    """``curve.png``: mean IoU against clicks per (method, prompt), with the 95 % band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k_max = summary["max_clicks"]
    ks = list(range(k_max + 1))
    fig, axes = plt.subplots(1, len(PROMPTS), figsize=(11, 4.2), sharey=True)
    colours = {"fseg": "tab:blue", "random-walker": "tab:orange", "watershed": "tab:green"}
    for ax, prompt in zip(np.atleast_1d(axes), PROMPTS, strict=False):
        for row, t in summary["rows"].items():
            method, p = row.split("|")
            if p != prompt:
                continue
            f = t["figures"]
            mean = [f[f"iou@{k}"]["value"] for k in ks]
            low = [f[f"iou@{k}"]["low"] if f[f"iou@{k}"]["low"] is not None else np.nan for k in ks]
            high = [f[f"iou@{k}"]["high"] if f[f"iou@{k}"]["high"] is not None else np.nan for k in ks]
            colour = colours.get(method)
            ax.plot(ks, mean, marker="o", ms=3, color=colour, label=METHOD_TITLES.get(method, method))
            ax.fill_between(ks, low, high, color=colour, alpha=0.15)
        ax.set_title(PROMPT_TITLES[prompt])
        ax.set_xlabel("clicks k")
        ax.set_xticks(ks)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("mean IoU (95 % interval over phantoms)")
    np.atleast_1d(axes)[0].legend(loc="lower right", fontsize=8)
    proto = summary.get("protocol", {})
    fig.suptitle(
        f"Click efficiency, {proto.get('split', '?')} split (seed {proto.get('seed', '?')}), "
        f"{summary['components']} components of {summary['phantoms']} phantoms"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_summary(out: Path, summary: Mapping[str, Any], plots: bool = True) -> list[Path]:
    """Write ``clicks.json``, ``clicks.md`` and (with ``plots``) ``curve.png`` into ``out``."""
    out = Path(out)
    written = [out / SUMMARY_JSON, out / SUMMARY_MD]
    (out / SUMMARY_JSON).write_text(json.dumps(summary, indent=1) + "\n")
    (out / SUMMARY_MD).write_text(render_markdown(summary))
    if plots and summary["rows"]:
        written.append(plot_curve(summary, out / CURVE_PNG))
    return written


def iter_records(out: str | Path) -> Iterable[dict[str, Any]]:
    """The finished lines of ``OUT/results.jsonl``."""
    return list(_done(Path(out)).values())
