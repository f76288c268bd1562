"""π_init's presence operating point (``stage1_presence_bias``; ``policy.vlm.presence_decision_ids``).

π_init decides in its think ("…look for edema in the left lung: none." before an absent answer,
"…: 1 region(s)." before a present one); the bias is added to the token that makes that choice.
The committed demo's π_init is the model under test (sample-data phantoms, on which no model
choice was made); the tokenizers are the demo's and the tiny offline one of ``tiny_vlm``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_stop_bias import image

from monailabel_xflow.eval.phantom_manifest import stage1_identity
from monailabel_xflow.instructions import parse_instruction
from monailabel_xflow.policy.base import MAX_STOP_BIAS, PolicyError
from monailabel_xflow.policy.protocol import parse_stage1
from monailabel_xflow.policy.targets import init_target
from monailabel_xflow.policy.vlm import VLMPolicy, presence_decision_ids
from monailabel_xflow.vocabulary import LEFT_LUNG, RIGHT_LUNG
from monailabel_xflow.workflow.model_config import DEMO_DIR, DEMO_MODELS_FILE, ModelConfig, ModelConfigError

QUESTIONS = [
    "Segment the effusion in the left lung.",
    "Segment the edema.",
    "Segment the pneumonia in the right lung.",
    "Segment the atelectasis in the left lung.",
    "Segment the cardiomegaly.",
]
STUDIES = ("phantom_1_00000", "phantom_1_00003", "phantom_1_00004")


@pytest.mark.parametrize("which", ["demo", "tiny"])
def test_the_absent_choice_is_where_the_think_parts_from_a_present_one(which, tiny_vlm):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(DEMO_DIR / "base" if which == "demo" else tiny_vlm.base))
    choice = list(presence_decision_ids(tok))
    assert len(choice) == 2
    lungs = {LEFT_LUNG: (0.5, 0.1, 0.9, 0.9), RIGHT_LUNG: (0.1, 0.1, 0.5, 0.9)}
    lesion = np.zeros((64, 64), bool)
    lesion[10:30, 12:28] = True
    for question in ("Segment the pneumonia in the right lung.", "Segment the effusion."):
        instruction = parse_instruction(question)

        def ids(mask, instruction=instruction):
            return tok(init_target(instruction, mask, lungs), add_special_tokens=False)["input_ids"]

        absent, present = ids(None), ids(lesion)
        at = next(k for k in range(len(absent)) if absent[k : k + 2] == choice)  # in every absent think…
        assert present[: at + 1] == absent[: at + 1] and present[at + 1] != absent[at + 1]  # …where it parts
        assert all(present[k : k + 2] != choice for k in range(len(present)))  # never in a present one
    if which == "demo":
        assert tok.decode(choice[-1]).strip() == "none"


def test_the_models_file_field_is_bounded_and_reaches_stage1_only():
    assert ModelConfig().stage1_presence_bias == 0.0 and "stage1_presence_bias" not in ModelConfig().identities()
    config = ModelConfig.from_dict({"stage1_presence_bias": "-0.5"})
    assert config.stage1_presence_bias == -0.5 and config.identities()["stage1_presence_bias"] == "-0.5"
    assert ModelConfig.from_env({"XFLOW_STAGE1_PRESENCE_BIAS": "1"}).stage1_presence_bias == 1.0
    for bad in ("often", "nan", MAX_STOP_BIAS + 1, -MAX_STOP_BIAS - 1, "-inf"):
        with pytest.raises(ModelConfigError, match="stage1_presence_bias"):
            ModelConfig.from_dict({"stage1_presence_bias": bad})
    from monailabel_xflow.workflow.model_config import load_models

    demo = ModelConfig.from_file(DEMO_MODELS_FILE)
    loaded = load_models(replace(demo, stage1_presence_bias=2.5))
    assert isinstance(loaded.stage1, VLMPolicy) and loaded.stage1.presence_bias == 2.5
    with pytest.raises(PolicyError, match="presence_bias"):
        VLMPolicy(loaded.stage1.model, loaded.stage1.processor, presence_bias=float("nan"))
    # the phantom benchmark's Stage 1 text cache: a new bias is a new identity, none keeps the old one
    unbiased = replace(demo, stage1_presence_bias=0.0)
    assert stage1_identity(replace(demo, stage1_presence_bias=-0.5)) != stage1_identity(unbiased)
    assert stage1_identity(unbiased) == stage1_identity(replace(unbiased, stage2_stop_bias=1.0))


def test_the_bias_decides_between_absent_and_present():
    """At +MAX π_init answers absent to every question, at -MAX present (with a box), asked in a
    batch or alone; at 0 it answers both ways on these phantoms, so each extreme changed some."""
    from monailabel_xflow.workflow.model_config import load_models

    init = load_models(replace(ModelConfig.from_file(DEMO_MODELS_FILE), stage1_presence_bias=0.0)).stage1
    model, processor = init.model, init.processor
    policies = {b: VLMPolicy(model, processor, presence_bias=b) for b in (MAX_STOP_BIAS, 0.0, -MAX_STOP_BIAS)}
    answers: dict[float, list[bool]] = {b: [] for b in policies}
    for study in STUDIES:
        img = image(study)
        instructions = [parse_instruction(q) for q in QUESTIONS]
        for bias, policy in policies.items():
            # both Stage 1 paths: the batched "all findings" call and one question at a time
            texts = policy.stage1_many(img, instructions) + [policy.stage1(img, i) for i in instructions]
            for text in texts:
                parsed = parse_stage1(text).value
                assert parsed is not None, text
                answers[bias].append(parsed.present and bool(parsed.lesions) if bias < 0 else parsed.present)
    assert not any(answers[MAX_STOP_BIAS]) and all(answers[-MAX_STOP_BIAS])
    assert 0 < sum(answers[0.0]) < len(answers[0.0])
