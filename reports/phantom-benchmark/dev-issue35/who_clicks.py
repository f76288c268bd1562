"""Who decides and who places the click in Stage 2 (dev diagnostic, section 8 of README.md).

Two hybrids of the committed demo's π_rev and the oracle, on the questions and Stage 1 texts of a
finished ``xflow benchmark phantom ... --methods stage1,stage1+2,oracle`` folder BENCH:

* ``policy-decides``: π_rev decides stop or click; when it clicks, the simulated user (τ = 1)
  places the click;
* ``oracle-decides``: the oracle (τ = 0.7, Algorithm 1) decides; when it clicks, π_rev places
  the click (its stop bias at -20 forces a click).

Writes ``OUT/<mode>/revisions.jsonl`` and prints ``stop_decisions`` against BENCH's oracle (mean
IoU change per lesion against the ground truth).

    python reports/phantom-benchmark/dev-issue35/who_clicks.py MODE BENCH OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

from replay import demo_flow, replay

from monailabel_xflow.eval.phantom_protocol import case_gt
from monailabel_xflow.policy.oracle import GroundTruthReviser, simulated_user
from monailabel_xflow.policy.protocol import parse_stage2
from monailabel_xflow.policy.vlm import VLMPolicy

mode, bench, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
if mode not in ("policy-decides", "oracle-decides"):
    raise SystemExit(f"MODE must be policy-decides or oracle-decides, got {mode!r}")
cfg, loaded, flow = demo_flow(bench)
rev = loaded.reviser
forced = VLMPolicy(rev.model, rev.processor, generation=rev.generation, stop_bias=-20.0)


def is_stop(answer) -> bool:
    action = answer if not isinstance(answer, str) else parse_stage2(answer).value
    return action is None or action.click is None


class Hybrid:
    def __init__(self, gt):
        self.decider = GroundTruthReviser(gt)  # τ = 0.7, as Algorithm 1
        self.placer = GroundTruthReviser(gt, simulated_user(cfg.max_clicks))  # τ = 1

    def start(self, image, instruction, box):
        return Session(
            rev.start(image, instruction, box),
            forced.start(image, instruction, box),
            self.decider.start(image, instruction, box),
            self.placer.start(image, instruction, box),
        )


class Session:
    def __init__(self, pol, pol_forced, decider, placer):
        self.pol, self.pol_forced, self.decider, self.placer = pol, pol_forced, decider, placer
        self.zoom = False

    def step(self, state):
        if mode == "policy-decides":
            said = self.pol.step(state)
            return said if is_stop(said) else self.placer.step(state)
        said = self.decider.step(state)
        if is_stop(said):
            return said
        self.pol_forced.step(state.__class__(**{**state.__dict__, "step": len(self.pol_forced.texts)}))
        return self.pol_forced.texts[-1]


print(replay(flow, bench, out / mode, lambda case, image: Hybrid(case_gt(case, image.shape))))
