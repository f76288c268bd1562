"""Stage 2 replayed behind the demo's cached Stage 1: the setup the dev diagnostics of sections 8,
10 and 11 share (``who_clicks.py``, ``click_snap.py``, ``rev_behind_stage1.py``).

BENCH is a finished ``xflow benchmark phantom ... --methods stage1,stage1+2,oracle`` folder made
with the demo's models file: its Stage 1 texts are reused, its questions replayed, and the
replayed revisions scored against its oracle with ``stop_decisions`` (mean IoU change per lesion
against the ground truth).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.data.readers import read_mimic_ils
from monailabel_xflow.eval.phantom_benchmark import interleaved
from monailabel_xflow.eval.phantom_manifest import stage1_identity
from monailabel_xflow.eval.phantom_methods import SharedStage1, _Revisions
from monailabel_xflow.eval.phantom_protocol import STAGE1_NAME, case_gt
from monailabel_xflow.eval.phantom_statistics import stop_decisions
from monailabel_xflow.geometry import Click, pixel_to_point, point_to_pixel
from monailabel_xflow.policy.protocol import Stage2Action, parse_stage2
from monailabel_xflow.transforms.loading import load_cxr
from monailabel_xflow.workflow.model_config import DEMO_MODELS_FILE, ModelConfig, load_models
from monailabel_xflow.workflow.xflow import XFlow


def bench_cases(bench: Path) -> list:
    """BENCH's held-out questions (basic and global), with their ground truth, in the file's order."""
    heldout = bench / "data" / "ground-truth" / "heldout.json"
    return read_mimic_ils(heldout, split="test", kinds=("basic", "global")).cases


def demo_flow(bench: Path, reviser: Any = None) -> tuple[ModelConfig, Any, XFlow]:
    """``(cfg, loaded, flow)``: the demo's models, and an XFlow whose Stage 1 answers come from
    BENCH's texts and whose π_rev is ``reviser`` (default the demo's)."""
    cfg = ModelConfig.load(DEMO_MODELS_FILE)
    loaded = load_models(cfg)
    flow = XFlow(
        SharedStage1(loaded.stage1, bench / STAGE1_NAME, stage1_identity(cfg)),
        loaded.reviser if reviser is None else reviser,
        loaded.segmenter,
        max_clicks=cfg.max_clicks,
        models=loaded.identities,
    )
    return cfg, loaded, flow


def replay(flow: XFlow, bench: Path, folder: Path, reviser_for: Callable[[Any, Any], Any] | None = None) -> Any:
    """Run ``flow`` on BENCH's questions into ``folder/revisions.jsonl`` (replaced) and return
    ``stop_decisions`` against BENCH's oracle. ``reviser_for(case, image)`` gives a question its
    own π_rev (default the flow's). ``folder/scores.jsonl`` holds each question's answer against
    its ground truth (intersection and union in pixels, as the benchmark's ``results.jsonl``
    stats; ``giou.py`` pairs them)."""
    cases = interleaved(bench_cases(bench))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "revisions.jsonl").unlink(missing_ok=True)
    revisions = _Revisions(folder / "revisions.jsonl")
    with (folder / "scores.jsonl").open("w") as scores:
        for i, case in enumerate(cases):
            image = load_cxr(case.image_path)[0]
            reviser = reviser_for(case, image) if reviser_for is not None else None
            result = flow.run(image, case.instruction, reviser=reviser)
            revisions.add(case.case_id, result.trace)
            gt = case_gt(case, image.shape)
            inter, union = int((result.mask & gt).sum()), int((result.mask | gt).sum())
            scores.write(json.dumps({"case_id": case.case_id, "intersection": inter, "union": union}) + "\n")
            if i % 50 == 0:
                print(i, flush=True)
    return stop_decisions(folder, bench / "oracle", cases)


KEEP = "keep"  # what a ``move`` returns to leave π_rev's click as it said it


class MovedClicks:
    """π_rev ``rev`` whose positive clicks go through ``move`` before F_seg answers them.

    ``move(image, state, row, col)`` gets the image, the Stage 2 state and the clicked pixel, and
    returns the pixel to click instead (re-emitted at its centre), None to read the click as a
    stop, or :data:`KEEP`. Negative clicks and stops are π_rev's.
    """

    def __init__(self, rev: Any, move: Callable[[np.ndarray, Any, int, int], Any]) -> None:
        self.rev, self.move = rev, move

    def start(self, image: np.ndarray, instruction: str, box: Any) -> _MovedSession:
        return _MovedSession(self.rev.start(image, instruction, box), image, self.move)


class _MovedSession:
    zoom = False

    def __init__(self, session: Any, image: np.ndarray, move: Callable[[np.ndarray, Any, int, int], Any]) -> None:
        self.session, self.image, self.move = session, image, move

    def step(self, state: Any) -> Any:
        said = self.session.step(state)
        action = parse_stage2(said).value
        click = action.click if action is not None else None
        if click is None or not click.positive:
            return said
        to = self.move(self.image, state, *point_to_pixel(click.x, click.y, state.mask.shape))
        if to is None:
            return Stage2Action(None)
        if to == KEEP:
            return said
        return Stage2Action(Click(True, *pixel_to_point(*to, state.mask.shape)))
