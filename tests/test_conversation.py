"""Training sees what inference sees: for one oracle trajectory built by the rev-sft builder, the
token ids, token types and pixels SFT trains on equal those ``VLMPolicy`` feeds the model, turn by
turn; and likewise for a Stage 1 question (``policy/conversation.py`` encodes both)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from test_builders import SAMPLE, _one_component_case

from monailabel_xflow.data.readers import read_mimic_ils
from monailabel_xflow.geometry import FULL_VIEW, from_view
from monailabel_xflow.instructions import parse_instruction
from monailabel_xflow.policy.base import RevisionState
from monailabel_xflow.policy.oracle import OracleClicker
from monailabel_xflow.testing import ScriptedSegmenter
from monailabel_xflow.training.builders import LungBoxes, build, load_built
from monailabel_xflow.training.sft import PolicyExampleEncoder
from monailabel_xflow.transforms import load_cxr


@pytest.fixture(scope="module")
def tiny(tiny_vlm):
    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy

    return VLMPolicy.from_pretrained(
        tiny_vlm.base, device="cpu", generation=GenerationSettings(max_new_tokens=8), reuse_cache=False
    )


@pytest.fixture(scope="module")
def cases():
    return read_mimic_ils(SAMPLE / "ground-truth" / "mimic_ils.json", split="train").cases


def forced_answers(monkeypatch, policy, answers: list[str]) -> list[dict]:
    """Let the model 'say' ``answers`` turn by turn (each followed by ``<end_of_turn>``, as a
    trained policy ends its turns) and record what each ``generate`` call was fed."""
    import torch

    calls, enc = [], policy.encoder

    def generate(**kw):
        calls.append({k: v for k, v in kw.items() if k in ("input_ids", "token_type_ids", "pixel_values")})
        said = enc.answer(answers[len(calls) - 1]).input_ids
        return type("Out", (), {"sequences": torch.cat([kw["input_ids"], said], dim=1), "cache": None})()

    monkeypatch.setattr(policy.model, "generate", generate)
    return calls


@pytest.mark.parametrize("zoom", [False, True], ids=["whole-image", "zoomed"])
def test_rev_sft_ids_are_the_ids_inference_feeds_the_model_turn_by_turn(tiny, cases, tmp_path, monkeypatch, zoom):
    import torch

    case, mask = _one_component_case(cases)
    # a strict τ and loose boxes: the oracle clicks before it stops
    clicker = OracleClicker(tau=0.99, box_noise=0.3)
    report = build(
        "rev-sft",
        [case],
        tmp_path,
        segmenter=ScriptedSegmenter(mask, positive_radius_px=8),
        clicker=clicker,
        progress=False,
        zoom=zoom,
    )
    assert report.rows == 1, report.rejected
    row = load_built(tmp_path)[0]
    assert len(row["targets"]) >= 2, "the trajectory should click at least once"
    trained = PolicyExampleEncoder(tiny.processor, "rev-sft")(row)

    # inference: the same observations, shown to π_rev's session one turn at a time; the session
    # is opened on the box in image coordinates, as the workflow opens it
    image, _ = load_cxr(row["image"])
    instruction = parse_instruction(row["instruction"])
    view = tuple(row["view"])
    assert (view != FULL_VIEW) == zoom
    x1, y1 = from_view(row["box"][0], row["box"][1], view)
    x2, y2 = from_view(row["box"][2], row["box"][3], view)
    calls = forced_answers(monkeypatch, tiny, list(row["targets"]))
    monkeypatch.setattr(tiny, "zoom", zoom)
    session = tiny.start(image, instruction, (x1, y1, x2, y2))
    assert session.zoom == zoom
    for t, png in enumerate(row["observations"]):
        observation = np.asarray(Image.open(png).convert("RGB"))
        said = session.step(RevisionState(image, instruction, (x1, y1, x2, y2), mask, [], observation, t, view))
        assert said == tiny.encoder.decode(tiny.encoder.answer(row["targets"][t]).input_ids[0])

    labelled = (trained["labels"] != -100).nonzero().flatten().tolist()
    for t, call in enumerate(calls):
        fed = call["input_ids"][0]
        # what the model was fed at turn t is exactly SFT's sequence up to answer t
        assert torch.equal(fed, trained["input_ids"][: len(fed)]), f"turn {t}"
        assert torch.equal(call["token_type_ids"][0], trained["token_type_ids"][: len(fed)]), f"turn {t}"
        # ... and SFT labels the tokens right after it (the answer), not the prompt
        assert len(fed) in labelled and len(fed) - 1 not in labelled
        # re-reading (no cache), turn t shows the model every observation so far
        assert torch.allclose(call["pixel_values"], trained["pixel_values"][: t + 1])
    # the whole conversation, answers included, is what SFT trains on
    assert torch.equal(session.input_ids[0], trained["input_ids"])


def test_init_sft_prompt_is_the_stage1_prompt(tiny, cases, tmp_path):
    import torch

    case = next(c for c in cases if c.positive)
    report = build("init-sft", [case], tmp_path, lung_boxes=LungBoxes.for_dataset(SAMPLE), progress=False)
    assert report.rows == 1, report.rejected
    row = load_built(tmp_path)[0]
    trained = PolicyExampleEncoder(tiny.processor, "init-sft")(row)
    image, _ = load_cxr(row["image"])
    fed = tiny.stage1_inputs(image, parse_instruction(row["instruction"]))
    n = fed.input_ids.shape[1]
    assert torch.equal(fed.input_ids[0], trained["input_ids"][:n])
    assert torch.equal(fed.token_type_ids[0], trained["token_type_ids"][:n])
    assert torch.allclose(fed.pixel_values, trained["pixel_values"])
    assert (trained["labels"][:n] == -100).all() and (trained["labels"][n:] != -100).all()
    answer = tiny.encoder.answer(row["target"]).input_ids[0]
    assert torch.equal(trained["input_ids"][n:], answer)


def test_all_findings_prepare_the_stage1_image_once(tiny, monkeypatch):
    """ "All findings" (``stage1_many``): the seven prompts equal the one-by-one prompts, from one
    PIL image and one image-processor pass."""
    import torch

    from monailabel_xflow.instructions import all_findings
    from monailabel_xflow.policy import conversation

    image = np.random.default_rng(0).random((120, 90)).astype(np.float32)
    instructions = all_findings()
    one_by_one = [tiny.encoder.stage1_prompt(image, i) for i in instructions]
    pil_calls, pixel_calls = [], []
    real_pil = conversation.image_to_pil
    monkeypatch.setattr(conversation, "image_to_pil", lambda a: pil_calls.append(1) or real_pil(a))
    processor_type = type(tiny.processor.image_processor)
    real_call = processor_type.__call__
    monkeypatch.setattr(
        processor_type, "__call__", lambda self, *a, **k: pixel_calls.append(1) or real_call(self, *a, **k)
    )
    together = tiny.encoder.stage1_prompts(image, instructions)
    assert len(pil_calls) == 1 and len(pixel_calls) == 1
    assert len(together) == len(one_by_one) == 7
    for a, b in zip(together, one_by_one, strict=True):
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.token_type_ids, b.token_type_ids)
        assert torch.equal(a.pixel_values, b.pixel_values)
    # a processor whose expansion the encoder cannot reproduce: every prompt the processor's way
    monkeypatch.setattr(tiny.processor, "boi_token", "<not-in-the-text>")
    pixel_calls.clear()
    fallback = tiny.encoder.stage1_prompts(image, instructions[:3])
    assert len(pixel_calls) == 3
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(fallback, one_by_one, strict=False))
