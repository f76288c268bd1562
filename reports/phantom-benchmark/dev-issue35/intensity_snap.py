"""π_rev's positive clicks moved to lesion-like pixels of the image (dev diagnostic, section 12 of README.md).

Section 10 moved π_rev's clicks by F_seg's logits, which do not say where a lesion continues.
This tries the image itself, the cue region growing uses: a pixel outside the current mask is
*lesion-like* when its smoothed intensity (Gaussian, sigma 2 px) lies nearer the mask's median
than the median of a ring around the mask (the ring from 3 to 12 px outside it). Each *positive*
click outside the mask is moved to the lesion-like pixel within RADIUS px of π_rev's point that
lies deepest inside the lesion-like region (farthest from its edge, ties to the nearest); with
GATE 1, a click with no lesion-like pixel within RADIUS is read as a stop. Negative clicks and
positive clicks inside the mask are π_rev's. Runs like ``click_snap.py``: on the questions and
Stage 1 texts of a finished ``xflow benchmark phantom ... --methods stage1,stage1+2,oracle``
folder BENCH made with the demo's models file; writes ``OUT/NAME/revisions.jsonl`` and prints
``stop_decisions`` against BENCH's oracle (mean IoU change per lesion against the ground truth).

    python reports/phantom-benchmark/dev-issue35/intensity_snap.py NAME BENCH OUT RADIUS GATE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from replay import KEEP, MovedClicks, demo_flow, replay
from scipy import ndimage

name, bench, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
radius, gate = float(sys.argv[4]), bool(int(sys.argv[5]))
_, loaded, flow = demo_flow(bench)
rev = loaded.reviser
moves: list[dict] = []


def lesion_like(smooth: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Pixels outside ``mask`` whose smoothed intensity is nearer the mask's median than the ring's."""
    ring = ndimage.binary_dilation(mask, iterations=12) & ~ndimage.binary_dilation(mask, iterations=3)
    if not mask.any() or not ring.any():
        return np.zeros_like(mask)
    inside, outside = float(np.median(smooth[mask])), float(np.median(smooth[ring]))
    return (np.abs(smooth - inside) < np.abs(smooth - outside)) & ~mask


def snap(image, state, r0, c0):
    if state.mask[r0, c0]:  # a positive click inside the mask: π_rev's
        return KEEP
    h, w = state.mask.shape
    like = lesion_like(ndimage.gaussian_filter(np.asarray(image, float), 2.0), state.mask)
    yy, xx = np.mgrid[:h, :w]
    candidates = like & ((yy - r0) ** 2 + (xx - c0) ** 2 <= radius**2)
    if not candidates.any():
        moves.append({"from": [r0, c0], "to": None})
        return None if gate else KEEP
    depth = ndimage.distance_transform_edt(like)
    score = np.where(candidates, depth - 1e-3 * np.hypot(yy - r0, xx - c0), -np.inf)
    r, c = divmod(int(np.argmax(score)), w)
    moves.append({"from": [r0, c0], "to": [r, c]})
    return r, c


folder = out / name
decisions = replay(flow, bench, folder, lambda case, image: MovedClicks(rev, snap))
(folder / "moves.json").write_text(json.dumps(moves))
print(name, json.dumps(decisions))
