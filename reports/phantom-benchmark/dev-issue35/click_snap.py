"""π_rev's clicks moved by F_seg's own logits (dev diagnostic, section 10 of README.md).

π_rev decides and clicks as in the committed demo; before F_seg answers, each *positive* click
outside the mask is changed by F_seg's logits for the current box and clicks (bilinear to the
image, as ``Sam3Segmenter.predict`` does):

* ``snap``: moved to the pixel outside the mask, within RADIUS px of π_rev's point, where F_seg's
  logit is highest (where F_seg is least sure the lesion ends);
* ``gate``: read as a stop when that logit is below TAU (RADIUS 0: π_rev's own pixel).

Negative clicks and positive clicks inside the mask are π_rev's. Runs on the questions and
Stage 1 texts of a finished ``xflow benchmark phantom ... --methods stage1,stage1+2,oracle``
folder BENCH made with the demo's models file, writes ``OUT/NAME/revisions.jsonl`` and prints
``stop_decisions`` against BENCH's oracle (mean IoU change per lesion against the ground truth).

    python reports/phantom-benchmark/dev-issue35/click_snap.py NAME BENCH OUT RADIUS TAU
    # RADIUS 0, TAU -1e9: the control (π_rev's clicks at their pixels' centres)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from replay import KEEP, MovedClicks, demo_flow, replay

name, bench, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
radius, tau = float(sys.argv[4]), float(sys.argv[5])
_, loaded, flow = demo_flow(bench)
rev, seg = loaded.reviser, loaded.segmenter
moves: list[dict] = []


def logits_now(state) -> np.ndarray:
    """F_seg's ``(H, W)`` logits for the state's box and clicks (Stage 2 also feeds back the
    previous logits; the control row shows this changes nothing measurable)."""
    return seg.predict([state.box], clicks=[list(state.clicks)] if state.clicks else None).logits[0]


def snap(image, state, r0, c0):
    h, w = state.mask.shape
    yy, xx = np.mgrid[:h, :w]
    candidates = ((yy - r0) ** 2 + (xx - c0) ** 2 <= radius**2) & ~state.mask
    if not candidates.any():  # a positive click inside the mask: π_rev's
        return KEEP
    scores = np.where(candidates, logits_now(state), -np.inf)
    r, c = divmod(int(np.argmax(scores)), w)
    moves.append({"from": [r0, c0], "to": [r, c], "logit": float(scores[r, c])})
    return None if scores[r, c] < tau else (r, c)


folder = out / name
decisions = replay(flow, bench, folder, lambda case, image: MovedClicks(rev, snap))
(folder / "moves.json").write_text(json.dumps(moves))
print(name, json.dumps(decisions))
