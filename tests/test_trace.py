"""The trace schema (xflow-trace/1): round trips, strict reading, pictures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monailabel_xflow import rle
from monailabel_xflow.geometry import Click
from monailabel_xflow.policy.protocol import BoxRef
from monailabel_xflow.testing import ellipse
from monailabel_xflow.workflow.trace import (
    SCHEMA,
    LesionRecord,
    RevisionStep,
    Stage1Record,
    Trace,
    TraceError,
    json_schema,
    render_contact_sheet,
    render_trace,
)

H, W = 96, 128


def make_trace() -> Trace:
    m0 = ellipse((H, W), 60, 90, 10, 14)
    m1 = m0 | ellipse((H, W), 60, 110, 6, 6)
    m2 = m1 & ~ellipse((H, W), 60, 90, 3, 3)
    box0 = (0.6, 0.5, 0.8, 0.75)
    steps = [
        RevisionStep(
            1,
            "<think>a</think><click>positive (900,625)</click>",
            "click",
            (0.6, 0.5, 0.9, 0.75),
            Click(True, 0.9, 0.625),
            True,
            rle.encode(m1),
            0.81,
            [],
            0.12,
        ),
        RevisionStep(
            2,
            "<think>b</think><click>negative (703,625)</click>",
            "click",
            (0.6, 0.5, 0.9, 0.75),
            Click(False, 0.703, 0.625),
            False,
            rle.encode(m2),
            0.85,
            [],
            0.1,
        ),
        RevisionStep(3, "<stop/>", "stop", (0.6, 0.5, 0.9, 0.75), problems=["missing <think>…</think>"], seconds=0.05),
    ]
    lesion = LesionRecord(
        0, "effusion", box0, rle.encode(m0), 0.7, steps, "stop", (0.6, 0.5, 0.9, 0.75), rle.encode(m2), 0.85
    )
    return Trace(
        instruction={
            "instruction": "Segment the effusion in the left lung.",
            "finding": "effusion",
            "regions": ["left lung"],
            "level": "lung",
            "kind": "basic",
        },
        image_size=(H, W),
        stage1=Stage1Record(
            "raw text", "thinking", [BoxRef("left lung", (0.55, 0.1, 0.95, 0.9))], True, [BoxRef("effusion", box0)], []
        ),
        present=True,
        mask=rle.encode(m2),
        answer="",
        lesions=[lesion],
        models={"segmenter": "/models/sam3"},
        settings={"max_clicks": 4, "revise": True},
        timings={"segmenter_encode": 1.5, "stage1": 2.0, "total": 4.0},
    )


def test_round_trip_through_json_text():
    trace = make_trace()
    text = trace.to_json()
    data = json.loads(text)
    assert data["schema"] == SCHEMA == "xflow-trace/1"
    again = Trace.from_json(text)
    assert again == trace
    assert again.lesions[0].clicks == [Click(True, 0.9, 0.625), Click(False, 0.703, 0.625)]
    np.testing.assert_array_equal(again.final_mask(), rle.decode(trace.mask))
    # JSON-native types only: a second dump is identical.
    assert json.dumps(again.to_dict(), indent=1) == text


def test_click_and_box_layout_is_documented_one():
    step = make_trace().to_dict()["lesions"][0]["steps"][1]
    assert step["click"] == {"polarity": "negative", "point": [0.703, 0.625]}
    assert step["box"] == [0.6, 0.5, 0.9, 0.75] and step["box_grown"] is False
    assert set(step["mask"]) == {"size", "counts"} and step["mask"]["size"] == [H, W]


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.update(schema="xflow-trace/2"), "unsupported trace schema"),
        (lambda d: d.pop("schema"), "unsupported trace schema"),
        (lambda d: d.pop("stage1"), "malformed trace"),
        (lambda d: d.update(image_size=[1, 2, 3]), "image_size"),
        (lambda d: d["lesions"][0]["steps"][0].update(action="jump"), "action"),
        (lambda d: d["lesions"][0]["steps"][0]["click"].update(polarity="up"), "polarity"),
        (lambda d: d["lesions"][0].update(end="bored"), "end"),
        (lambda d: d["stage1"]["lungs"][0].update(box=[0, 1]), "box"),
    ],
)
def test_reader_rejects_what_it_does_not_know(mutate, match):
    data = make_trace().to_dict()
    mutate(data)
    with pytest.raises(TraceError, match=match):
        Trace.from_dict(data)


def test_bad_json_text_is_a_trace_error():
    with pytest.raises(TraceError, match="not valid JSON"):
        Trace.from_json("{not json")
    with pytest.raises(TraceError, match="JSON object"):
        Trace.from_dict([1, 2])  # type: ignore[arg-type]


def test_render_trace_one_picture_per_decision():
    trace = make_trace()
    image = np.linspace(0, 1, H * W, dtype=np.float32).reshape(H, W)
    pictures = render_trace(trace, image)
    names = [name for name, _ in pictures]
    assert names == ["stage1", "lesion1_step0", "lesion1_step1", "lesion1_step2", "final"]
    for _, rgb in pictures:
        assert rgb.shape == (H, W, 3) and rgb.dtype == np.uint8
    plain = np.repeat((image * 255).round().astype(np.uint8)[..., None], 3, axis=2)
    # Each step picture differs from the next (a mask or a click changed) and from the bare image.
    for (_, a), (_, b) in zip(pictures[1:-1], pictures[2:-1], strict=False):
        assert not np.array_equal(a, b)
    assert all(np.abs(rgb.astype(int) - plain).sum() > 0 for _, rgb in pictures)
    # The final picture colours the answer mask and leaves far-away pixels alone.
    final = pictures[-1][1]
    assert not np.array_equal(final[60, 110], plain[60, 110]) and np.array_equal(final[5, 5], plain[5, 5])


def test_contact_sheet_holds_every_picture():
    trace = make_trace()
    image = np.full((H, W), 0.5, np.float32)
    sheet = render_contact_sheet(trace, image, ncols=3, tile_size=64)
    assert sheet.dtype == np.uint8 and sheet.ndim == 3 and sheet.shape[2] == 3
    assert sheet.shape[1] == 3 * 64 and sheet.shape[0] >= 2 * 64  # 5 tiles on 2 rows


def test_render_refuses_another_image_size():
    with pytest.raises(TraceError, match="image is"):
        render_trace(make_trace(), np.zeros((H + 1, W), np.float32))


def test_absent_trace_renders_two_pictures():
    trace = make_trace()
    trace.lesions, trace.present = [], False
    trace.mask = rle.encode(np.zeros((H, W), bool))
    trace.answer = "There is no effusion in the left lung."
    names = [n for n, _ in render_trace(trace, np.zeros((H, W), np.float32))]
    assert names == ["stage1", "final"]


def test_json_schema_accepts_traces_and_rejects_bad_ones():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    good = json.loads(make_trace().to_json())
    jsonschema.validate(good, schema)
    absent = make_trace()
    absent.lesions, absent.present, absent.batch = [], False, {"index": 0, "size": 7}
    jsonschema.validate(absent.to_dict(), schema)
    bad = json.loads(make_trace().to_json())
    bad["lesions"][0]["steps"][0]["click"]["polarity"] = "up"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad = json.loads(make_trace().to_json())
    bad["schema"] = "xflow-trace/0"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
