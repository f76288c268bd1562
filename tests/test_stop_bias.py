"""π_rev's stop threshold (``stage2_stop_bias``; ``policy.vlm.stop_decision_ids``).

π_rev decides in its think ("The mask fits…" before a stop, "misses…"/"spills…" before a click);
the bias is added to the token that makes that choice. The committed demo's π_rev is the model
under test (sample-data phantoms, on which no model choice was made); the tokenizers are the
demo's and the tiny offline one of ``tiny_vlm``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow.geometry import Click
from monailabel_xflow.policy.base import MAX_STOP_BIAS, PolicyError
from monailabel_xflow.policy.targets import revision_target
from monailabel_xflow.policy.vlm import VLMPolicy, stop_decision_ids
from monailabel_xflow.workflow.model_config import DEMO_DIR, DEMO_MODELS_FILE, ModelConfig, ModelConfigError

ROOT = Path(__file__).resolve().parents[1]
LEFT_EFFUSION = "Segment the effusion in the left lung."
# sample-data phantoms whose left effusion the demo's Stage 1 finds (checked by the test)
STUDIES = ("phantom_1_00000", "phantom_1_00003")


@pytest.fixture(scope="module")
def demo():
    from monailabel_xflow.workflow.xflow import XFlow

    return XFlow.from_config(DEMO_MODELS_FILE)


def image(study: str) -> np.ndarray:
    return np.asarray(Image.open(ROOT / "sample-data" / f"{study}.png").convert("L"), np.float32) / 255.0


@pytest.mark.parametrize("which", ["demo", "tiny"])
def test_the_stop_choice_is_the_first_token_no_click_shares(which, tiny_vlm):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(DEMO_DIR / "base" if which == "demo" else tiny_vlm.base))
    choice = list(stop_decision_ids(tok))
    stop = tok(revision_target(None), add_special_tokens=False)["input_ids"]
    clicks = [tok(revision_target(Click(p, 0.3, 0.7)), add_special_tokens=False)["input_ids"] for p in (True, False)]
    assert stop[: len(choice)] == choice  # a prefix of the stop answer
    for click in clicks:
        assert click[: len(choice) - 1] == choice[:-1]  # the context is shared with every click…
        assert click[: len(choice)] != choice  # …the last token is not
    if which == "demo":
        assert tok.decode(choice[-1]).strip() == "fits"


def test_the_models_file_field_is_bounded_and_reaches_the_policy():
    assert ModelConfig().stage2_stop_bias == 0.0 and "stage2_stop_bias" not in ModelConfig().identities()
    config = ModelConfig.from_dict({"stage2_stop_bias": "1.5"})
    assert config.stage2_stop_bias == 1.5 and config.identities()["stage2_stop_bias"] == "1.5"
    assert ModelConfig.from_env({"XFLOW_STAGE2_STOP_BIAS": "-2"}).stage2_stop_bias == -2.0
    for bad in ("often", "nan", MAX_STOP_BIAS + 1, -MAX_STOP_BIAS - 1, "inf"):
        with pytest.raises(ModelConfigError, match="stage2_stop_bias"):
            ModelConfig.from_dict({"stage2_stop_bias": bad})
    from monailabel_xflow.workflow.model_config import load_models

    loaded = load_models(replace(ModelConfig.from_file(DEMO_MODELS_FILE), stage2_stop_bias=2.5))
    assert isinstance(loaded.reviser, VLMPolicy) and loaded.reviser.stop_bias == 2.5
    with pytest.raises(PolicyError, match="stop_bias"):
        VLMPolicy(loaded.reviser.model, loaded.reviser.processor, stop_bias=float("nan"))


def test_the_bias_decides_between_stopping_and_clicking(demo):
    """At +MAX π_rev stops on every Stage 1 mask and keeps it; at -MAX its first answer is a click;
    unbiased, the demo's π_rev answers as it does without the setting."""
    rev = demo.reviser
    stopping, clicking = (VLMPolicy(rev.model, rev.processor, stop_bias=b) for b in (MAX_STOP_BIAS, -MAX_STOP_BIAS))
    lesions = 0
    for study in STUDIES:
        img = image(study)
        stops = demo.run(img, LEFT_EFFUSION, reviser=stopping).trace.lesions
        clicks = demo.run(img, LEFT_EFFUSION, reviser=clicking).trace.lesions
        plain = demo.run(img, LEFT_EFFUSION, reviser=VLMPolicy(rev.model, rev.processor)).trace.lesions
        default = demo.run(img, LEFT_EFFUSION).trace.lesions
        assert len(stops) == len(clicks) == len(plain) == len(default) >= 1, study  # Stage 1 is untouched
        for s, c, p, d in zip(stops, clicks, plain, default, strict=True):
            lesions += 1
            assert [step.action for step in s.steps] == ["stop"] and s.end == "stop"
            assert s.iou == s.initial_iou and np.array_equal(s.mask.mask(), s.initial_mask.mask())
            assert c.steps[0].action == "click" and c.steps[0].raw.startswith("<think>The mask ")
            assert not c.steps[0].raw.startswith("<think>The mask fits")
            assert [x.raw for x in p.steps] == [x.raw for x in d.steps]
    assert lesions >= 2
