"""Where Stage 2's clicks must land, and rules that place π_rev's clicks without retraining (dev
diagnostics, section 16 of README.md).

Every mode replays Stage 2 behind the demo's cached Stage 1 (``replay.py``) on a finished
``xflow benchmark phantom ... --methods stage1,stage1+2,oracle`` folder BENCH made with the
demo's models file:

* ``vote N T``: at every Stage 2 turn π_rev is sampled N times (temperature T) from the same
  conversation; the answer is the most common of stop / positive click / negative click (a tie
  stops; a sample that does not parse abstains), and among the clicks of that kind the one
  nearest the others (the medoid). The conversation goes on from the chosen sample, so π_rev
  reads its own text as usual. Self-consistency (Wang et al., 2023) asks whether π_rev's clicks
  scatter around a good place (their medoid lands better than one greedy click) or sit beside
  it (no vote helps).
  Writes ``OUT/spread.jsonl``: per turn, each sample's action and the chosen medoid's distance to
  each click of its kind (pixels of the 256-px phantom).
* ``displace R``: the simulated user of the oracle rows (Algorithm 1, the benchmark's
  ``GroundTruthReviser``) decides and places every click, and the click is then moved R pixels
  in a random direction (seeded by question), clipped to the image: how precisely a click must
  land for Stage 2 to pay, on the demo's own masks.
* ``box-deepest``: the demo's π_rev decides; each of its positive clicks is moved to the pixel of
  the box, outside the mask, farthest from both (no ground truth: where a box drawn on a lesion
  leaves the most unexplained room).
* ``pull D``: the demo's π_rev decides; each positive click outside the mask farther than D px
  from it is moved along the line to the nearest mask pixel until it lies D px from the mask.
* ``ensemble REV ...``: several π_rev (the models files REV, e.g. the demo's and retrainings with
  other seeds) answer every turn greedily; the answer is their vote, as ``vote``'s, and every
  member's conversation goes on from it.
* ``empty-stops``: the demo's π_rev, except that a box whose Stage 1 mask is empty is not revised
  (the workflow already answers "absent" when every box's mask is empty).

Prints ``stop_decisions`` against BENCH's oracle and writes ``OUT/revisions.jsonl``.

    python reports/phantom-benchmark/dev-issue35/placement.py vote N T BENCH OUT
    python reports/phantom-benchmark/dev-issue35/placement.py displace R BENCH OUT
    python reports/phantom-benchmark/dev-issue35/placement.py box-deepest BENCH OUT
    python reports/phantom-benchmark/dev-issue35/placement.py pull D BENCH OUT
    python reports/phantom-benchmark/dev-issue35/placement.py empty-stops BENCH OUT
    python reports/phantom-benchmark/dev-issue35/placement.py ensemble BENCH OUT REV [REV ...]
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np
import torch
from replay import KEEP, MovedClicks, demo_flow, replay
from scipy import ndimage

from monailabel_xflow.eval.phantom_protocol import case_gt
from monailabel_xflow.geometry import Click, pixel_to_point, point_to_pixel
from monailabel_xflow.policy.oracle import GroundTruthReviser
from monailabel_xflow.policy.protocol import Stage2Action, parse_stage2
from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy
from monailabel_xflow.workflow.model_config import ModelConfig, load_models

mode = sys.argv[1]
torch.manual_seed(0)


def kind(text: str) -> str:
    """``stop``, ``pos``, ``neg``, or ``bad`` for text that does not parse (it abstains)."""
    parsed = parse_stage2(text)
    if parsed.problems:
        return "bad"
    if parsed.value.click is None:
        return "stop"
    return "pos" if parsed.value.click.positive else "neg"


def vote(kinds: list[str], texts: list[str], shape) -> tuple[str, int, list[float]]:
    """The most common of stop / pos / neg (a tie stops) and the index of its medoid answer, with
    the medoid's distances (px) to the other clicks of its kind."""
    counts = {k: kinds.count(k) for k in ("stop", "pos", "neg")}
    best = max(counts.values())
    chosen = (
        "stop"
        if counts["stop"] == best or counts["pos"] == counts["neg"] == best
        else max(("pos", "neg"), key=lambda k: counts[k])
    )
    group = [i for i, k in enumerate(kinds) if k == chosen]
    if not group:
        return chosen, 0, []
    if chosen == "stop":
        return chosen, group[0], []
    clicks = [parse_stage2(texts[i]).value.click for i in group]
    pts = np.array([point_to_pixel(c.x, c.y, shape) for c in clicks], dtype=float)
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    pick = int(np.argmin(d.sum(1)))
    return chosen, group[pick], [round(float(v), 1) for v in d[pick]]


if mode == "vote":
    n, temperature, bench, out = int(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5])
    cfg, loaded, flow = demo_flow(bench)
    rev = loaded.reviser
    settings = GenerationSettings(do_sample=True, temperature=temperature, max_new_tokens=rev.generation.max_new_tokens)
    sampler = VLMPolicy(rev.model, rev.processor, generation=settings, reuse_cache=False, stop_bias=rev.stop_bias)
    out.mkdir(parents=True, exist_ok=True)
    spread = (out / "spread.jsonl").open("w")

    class Voting:
        def start(self, image, instruction, box):
            return _VotingSession(sampler.start(image, instruction, box))

    class _VotingSession:
        zoom = False

        def __init__(self, session):
            self.session = session

        def _state(self):
            s = self.session
            return s.input_ids, s.token_type_ids, list(s.pixel_values), list(s.texts), list(s.answer_spans)

        def _restore(self, saved):
            s = self.session
            s.input_ids, s.token_type_ids = saved[0], saved[1]
            s.pixel_values, s.texts, s.answer_spans = list(saved[2]), list(saved[3]), list(saved[4])

        def step(self, state):
            before = self._state()
            samples = []
            for _ in range(n):
                self._restore(before)
                text = self.session.step(state)
                samples.append((text, kind(text), self._state()))
            kinds = [s[1] for s in samples]
            chosen, pick, dists = vote(kinds, [s[0] for s in samples], state.mask.shape)
            counts = {k: kinds.count(k) for k in ("stop", "pos", "neg", "bad")}
            text, _, saved = samples[pick]
            self._restore(saved)
            record = {"step": state.step, "counts": counts, "chosen": chosen, "medoid_dists": dists}
            spread.write(json.dumps(record) + "\n")
            spread.flush()
            return text

    print(replay(flow, bench, out, lambda case, image: Voting()))

elif mode == "ensemble":
    bench, out, rev_files = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
    cfg, loaded, flow = demo_flow(bench)
    members = []
    for rev_file in rev_files:
        rev = load_models(ModelConfig.load(rev_file)).reviser
        members.append(VLMPolicy(rev.model, rev.processor, generation=rev.generation, reuse_cache=False))

    class Ensemble:
        def start(self, image, instruction, box):
            return _EnsembleSession([m.start(image, instruction, box) for m in members])

    class _EnsembleSession:
        zoom = False

        def __init__(self, sessions):
            self.sessions = sessions

        def step(self, state):
            texts = [s.step(state) for s in self.sessions]
            kinds = [kind(t) for t in texts]
            _, pick, _ = vote(kinds, texts, state.mask.shape)
            start, end = self.sessions[pick].answer_spans[-1]
            said = self.sessions[pick].input_ids[:, start:end]
            for s in self.sessions:  # every member goes on from the ensemble's answer
                own = s.answer_spans[-1][0]
                s.input_ids = torch.cat([s.input_ids[:, :own], said], dim=1)
                s.token_type_ids = torch.cat([s.token_type_ids[:, :own], torch.zeros_like(said)], dim=1)
                s.answer_spans[-1] = (own, own + said.shape[1])
                s.texts[-1] = texts[pick]
            return texts[pick]

    print(replay(flow, bench, out, lambda case, image: Ensemble()))
elif mode == "displace":
    radius, bench, out = float(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    cfg, loaded, flow = demo_flow(bench)

    class Displaced:
        def __init__(self, gt, rng):
            self.oracle, self.rng = GroundTruthReviser(gt), rng

        def start(self, image, instruction, box):
            return _DisplacedSession(self.oracle.start(image, instruction, box), self.rng)

    class _DisplacedSession:
        zoom = False

        def __init__(self, session, rng):
            self.session, self.rng = session, rng

        def step(self, state):
            said = self.session.step(state)
            action = said if not isinstance(said, str) else parse_stage2(said).value
            if action is None or action.click is None or radius == 0:
                return said
            h, w = state.mask.shape
            row, col = point_to_pixel(action.click.x, action.click.y, (h, w))
            angle = self.rng.uniform(0, 2 * np.pi)
            row = int(np.clip(round(row + radius * np.sin(angle)), 0, h - 1))
            col = int(np.clip(round(col + radius * np.cos(angle)), 0, w - 1))
            return Stage2Action(Click(action.click.positive, *pixel_to_point(row, col, (h, w))))

    def reviser_for(case, image):
        rng = np.random.default_rng(zlib.crc32(case.case_id.encode()))
        return Displaced(case_gt(case, image.shape), rng)

    print(replay(flow, bench, out, reviser_for))
elif mode == "box-deepest":
    bench, out = Path(sys.argv[2]), Path(sys.argv[3])
    cfg, loaded, flow = demo_flow(bench)

    def deepest_in_box(image, state, row, col):
        h, w = state.mask.shape
        x1, y1, x2, y2 = state.box
        region = np.zeros((h, w), bool)
        region[int(y1 * h) : int(np.ceil(y2 * h)), int(x1 * w) : int(np.ceil(x2 * w))] = True
        region &= ~state.mask
        if not region.any():
            return KEEP
        depth = ndimage.distance_transform_edt(np.pad(region, 1))[1:-1, 1:-1]
        return tuple(int(v) for v in np.unravel_index(int(np.argmax(depth)), depth.shape))

    print(replay(flow, bench, out, lambda case, image: MovedClicks(loaded.reviser, deepest_in_box)))
elif mode == "pull":
    distance, bench, out = float(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    cfg, loaded, flow = demo_flow(bench)

    def pulled(image, state, row, col):
        if not state.mask.any() or state.mask[row, col]:
            return KEEP
        gap, (rows, cols) = ndimage.distance_transform_edt(~state.mask, return_indices=True)
        if gap[row, col] <= distance:
            return KEEP
        r0, c0 = rows[row, col], cols[row, col]  # the mask pixel nearest π_rev's click
        t = distance / gap[row, col]
        return int(round(r0 + t * (row - r0))), int(round(c0 + t * (col - c0)))

    print(replay(flow, bench, out, lambda case, image: MovedClicks(loaded.reviser, pulled)))
elif mode == "empty-stops":
    bench, out = Path(sys.argv[2]), Path(sys.argv[3])
    cfg, loaded, flow = demo_flow(bench)
    rev = loaded.reviser

    class EmptyStops:
        def start(self, image, instruction, box):
            return _EmptyStopsSession(rev.start(image, instruction, box))

    class _EmptyStopsSession:
        zoom = False

        def __init__(self, session):
            self.session = session

        def step(self, state):
            if state.step == 0 and not state.mask.any():
                return Stage2Action(None)
            return self.session.step(state)

    print(replay(flow, bench, out, lambda case, image: EmptyStops()))
else:
    raise SystemExit(f"MODE must be vote, ensemble, displace, box-deepest, pull or empty-stops, got {mode!r}")
