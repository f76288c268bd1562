"""The XFlow trace: every decision of one run, as versioned JSON, and its pictures.

The trace is a product feature, not a debug log: a radiologist reads it to see how a mask was
reached (which lungs were grounded, whether the finding was called present, which boxes
prompted the segmenter, which clicks revised each mask). :class:`Trace` is plain data;
:meth:`Trace.to_dict` / :meth:`Trace.from_dict` round-trip it through JSON-compatible dicts and
:func:`render_trace` / :func:`render_contact_sheet` draw it (through :mod:`.rendering` only).

Schema ``xflow-trace/1`` (all coordinates normalised ``[0, 1]``, x first, boxes ``[x1, y1, x2,
y2]`` as in :mod:`.geometry`; masks are COCO RLE ``{"size": [H, W], "counts": str}`` of
:mod:`.rle`; times in seconds)::

    {
      "schema": "xflow-trace/1",
      "created": "2026-11-29T16:00:00Z",            # UTC, when the run finished
      "instruction": {"instruction": str, "finding": str, "regions": [str], "level": str,
                      "kind": str},                   # Instruction.to_dict()
      "image_size": [H, W],                           # pixels of the image the masks cover
      "models": {str: str},                           # model identities (paths / hub ids)
      "settings": {"max_clicks": int, "revise": bool},
      "stage1": {
        "raw": str,                                   # the policy's text, verbatim
        "think": str,
        "lungs": [{"label": str, "box": [4 floats]}],
        "present": true | false | null,               # as parsed; null = no readable answer
        "lesions": [{"label": str, "box": [4 floats]}],
        "problems": [str]                             # protocol.parse_stage1 problems
      },
      "present": bool,                                # the workflow's decision (see warnings)
      "lesions": [{                                   # one per lesion box that was segmented
        "index": int,                                 # 0-based, order of stage1.lesions
        "label": str, "box": [4 floats],              # b_0, the Stage 1 box
        "initial_mask": RLE, "initial_iou": float,    # M_0 and the segmenter's IoU estimate
        "steps": [{                                   # Stage 2, at most max_clicks entries
          "step": int,                                # 1-based t
          "raw": str,                                 # the revision policy's text, verbatim
          "action": "click" | "stop" | "malformed",
          "click": {"polarity": "positive" | "negative", "point": [x, y]} | null,
          "box": [4 floats],                          # b_t, after the growth rule
          "box_grown": bool,
          "mask": RLE | null, "iou": float | null,    # M_t; null when no click was executed
          "problems": [str],                          # protocol.parse_stage2 problems
          "seconds": float                            # policy turn + segmenter decode
        }],
        "end": "stop" | "max_clicks" | "malformed" | "not_revised",
        "box_final": [4 floats], "mask": RLE, "iou": float | null   # the revised mask
      }],
      "mask": RLE,                                    # union of the lesion masks (the answer)
      "answer": str,                                  # canonical answer sentence ("" = mask only)
      "warnings": [str],                              # workflow decisions on malformed output
      "timings": {str: float},                        # phase -> seconds (see XFlow.run)
      "batch": {"index": int, "size": int} | null,    # set by XFlow.run_all (shared phases)
      "stored": {"key": str, "created": str}          # optional: this answer came from the
    }                                                 # workspace store (workflow/answers.py), as
                                                      # computed at `created`; absent: computed now

A reader must reject a ``schema`` it does not know (:class:`TraceError`); new optional keys
may be added within ``xflow-trace/1``, anything else bumps the version. :func:`json_schema`
gives the same layout as a JSON Schema document for readers in other languages.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow import rle
from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import Box, Click
from monailabel_xflow.policy.protocol import BoxRef

SCHEMA = "xflow-trace/1"
"""Version string written in every trace; bumped on any incompatible change."""

ACTIONS = ("click", "stop", "malformed")
ENDS = ("stop", "max_clicks", "malformed", "not_revised")


class TraceError(InputError):
    """A trace dict that does not follow the schema (unknown version, missing or bad field)."""


# --- records --------------------------------------------------------------------------------


@dataclass
class Stage1Record:
    """What π_init said and how it was read."""

    raw: str
    think: str = ""
    lungs: list[BoxRef] = field(default_factory=list)
    present: bool | None = None
    lesions: list[BoxRef] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "raw": self.raw,
            "think": self.think,
            "lungs": [_ref_to_dict(b) for b in self.lungs],
            "present": self.present,
            "lesions": [_ref_to_dict(b) for b in self.lesions],
            "problems": list(self.problems),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Stage1Record:
        present = d.get("present")
        return cls(
            raw=str(d["raw"]),
            think=str(d.get("think", "")),
            lungs=[_ref_from_dict(b) for b in d.get("lungs", [])],
            present=None if present is None else bool(present),
            lesions=[_ref_from_dict(b) for b in d.get("lesions", [])],
            problems=[str(p) for p in d.get("problems", [])],
        )


@dataclass
class RevisionStep:
    """One Stage 2 turn: the policy's text, the action taken and the mask it produced.

    Attributes:
        step: 1-based step index t.
        raw: the revision policy's output, verbatim.
        action: ``"click"`` (executed), ``"stop"`` or ``"malformed"`` (unreadable; ends Stage 2).
        click: the click for ``"click"``, else None.
        box: the box after the growth rule (b_t); unchanged for stop/malformed.
        box_grown: whether this click grew the box.
        mask: RLE of M_t for ``"click"``, else None.
        iou: the segmenter's IoU estimate of M_t, else None.
        problems: what the protocol parser reported.
        seconds: wall time of the policy turn plus the segmenter decode.
    """

    step: int
    raw: str
    action: str
    box: Box
    click: Click | None = None
    box_grown: bool = False
    mask: Mapping[str, Any] | None = None
    iou: float | None = None
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "raw": self.raw,
            "action": self.action,
            "click": _click_to_dict(self.click),
            "box": [float(v) for v in self.box],
            "box_grown": self.box_grown,
            "mask": _plain(self.mask),
            "iou": self.iou,
            "problems": list(self.problems),
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RevisionStep:
        action = str(d["action"])
        if action not in ACTIONS:
            raise TraceError(f"step action {action!r} is not one of {ACTIONS}")
        return cls(
            step=int(d["step"]),
            raw=str(d["raw"]),
            action=action,
            click=_click_from_dict(d.get("click")),
            box=_box(d["box"]),
            box_grown=bool(d.get("box_grown", False)),
            mask=d.get("mask"),
            iou=_opt_float(d.get("iou")),
            problems=[str(p) for p in d.get("problems", [])],
            seconds=float(d.get("seconds", 0.0)),
        )


@dataclass
class LesionRecord:
    """One lesion box from Stage 1 and its revision."""

    index: int
    label: str
    box: Box
    initial_mask: Mapping[str, Any]
    initial_iou: float | None
    steps: list[RevisionStep] = field(default_factory=list)
    end: str = "not_revised"
    box_final: Box | None = None
    mask: Mapping[str, Any] | None = None
    iou: float | None = None

    @property
    def clicks(self) -> list[Click]:
        """The executed clicks, in order."""
        return [s.click for s in self.steps if s.action == "click" and s.click is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "label": self.label,
            "box": [float(v) for v in self.box],
            "initial_mask": _plain(self.initial_mask),
            "initial_iou": self.initial_iou,
            "steps": [s.to_dict() for s in self.steps],
            "end": self.end,
            "box_final": [float(v) for v in (self.box_final or self.box)],
            "mask": _plain(self.mask if self.mask is not None else self.initial_mask),
            "iou": self.iou,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LesionRecord:
        end = str(d.get("end", "not_revised"))
        if end not in ENDS:
            raise TraceError(f"lesion end {end!r} is not one of {ENDS}")
        return cls(
            index=int(d["index"]),
            label=str(d["label"]),
            box=_box(d["box"]),
            initial_mask=dict(d["initial_mask"]),
            initial_iou=_opt_float(d.get("initial_iou")),
            steps=[RevisionStep.from_dict(s) for s in d.get("steps", [])],
            end=end,
            box_final=_box(d["box_final"]) if d.get("box_final") is not None else None,
            mask=dict(d["mask"]) if d.get("mask") is not None else None,
            iou=_opt_float(d.get("iou")),
        )


@dataclass
class Trace:
    """Everything XFlow decided for one instruction on one image (schema ``xflow-trace/1``).

    See the module docstring for the JSON layout. ``mask`` is the answer mask (RLE); use
    :meth:`final_mask` for the array. The workflow records masks as :class:`~monailabel_xflow.rle.LazyRLE`,
    so RLE strings are computed only when the trace is written (:meth:`to_dict`).
    """

    instruction: dict[str, Any]
    image_size: tuple[int, int]
    stage1: Stage1Record
    present: bool
    mask: Mapping[str, Any]
    answer: str
    lesions: list[LesionRecord] = field(default_factory=list)
    models: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    batch: dict[str, int] | None = None
    stored: dict[str, str] | None = None
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    schema: str = SCHEMA

    def final_mask(self) -> NDArray[np.bool_]:
        """The answer mask as a bool ``(H, W)`` array."""
        return rle.decode(self.mask)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict following the schema (floats, ints, strings, lists, dicts)."""
        return {
            "schema": self.schema,
            "created": self.created,
            "instruction": dict(self.instruction),
            "image_size": [int(v) for v in self.image_size],
            "models": {str(k): str(v) for k, v in self.models.items()},
            "settings": dict(self.settings),
            "stage1": self.stage1.to_dict(),
            "present": bool(self.present),
            "lesions": [lesion.to_dict() for lesion in self.lesions],
            "mask": _plain(self.mask),
            "answer": self.answer,
            "warnings": list(self.warnings),
            "timings": {str(k): float(v) for k, v in self.timings.items()},
            "batch": dict(self.batch) if self.batch is not None else None,
            **({"stored": dict(self.stored)} if self.stored is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trace:
        """Rebuild a trace written by :meth:`to_dict`.

        Raises:
            TraceError: an unknown ``schema``, a missing key or a malformed value.
        """
        if not isinstance(d, Mapping):
            raise TraceError(f"a trace is a JSON object, got {type(d).__name__}")
        if d.get("schema") != SCHEMA:
            raise TraceError(f"unsupported trace schema {d.get('schema')!r}; this reader knows {SCHEMA!r}")
        try:
            size = tuple(int(v) for v in d["image_size"])
            if len(size) != 2:
                raise TraceError(f"image_size must be [H, W], got {d['image_size']!r}")
            return cls(
                schema=SCHEMA,
                created=str(d.get("created", "")),
                instruction=dict(d["instruction"]),
                image_size=(size[0], size[1]),
                models={str(k): str(v) for k, v in d.get("models", {}).items()},
                settings=dict(d.get("settings", {})),
                stage1=Stage1Record.from_dict(d["stage1"]),
                present=bool(d["present"]),
                lesions=[LesionRecord.from_dict(x) for x in d.get("lesions", [])],
                mask=dict(d["mask"]),
                answer=str(d["answer"]),
                warnings=[str(w) for w in d.get("warnings", [])],
                timings={str(k): float(v) for k, v in d.get("timings", {}).items()},
                batch=dict(d["batch"]) if d.get("batch") is not None else None,
                stored={str(k): str(v) for k, v in d["stored"].items()} if d.get("stored") is not None else None,
            )
        except TraceError:
            raise
        except (KeyError, TypeError, ValueError) as err:
            raise TraceError(f"malformed trace: {type(err).__name__}: {err}") from err

    def to_json(self, indent: int | None = 1) -> str:
        """The trace as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Trace:
        """Parse JSON text written by :meth:`to_json` (raises :class:`TraceError`)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceError(f"trace is not valid JSON: {err}") from err
        return cls.from_dict(data)


# --- machine-readable schema ----------------------------------------------------------------


def json_schema() -> dict[str, Any]:
    """The trace layout as a JSON Schema (draft-07) document, for consumers in other languages.

    It states what the module docstring states; :meth:`Trace.from_dict` is the reference reader.
    """
    number01 = {"type": "number", "minimum": 0, "maximum": 1}
    box = {"type": "array", "items": number01, "minItems": 4, "maxItems": 4}
    rle_ = {
        "type": "object",
        "required": ["size", "counts"],
        "properties": {
            "size": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2},
            "counts": {"type": "string"},
        },
    }
    grounded = {"type": "object", "required": ["label", "box"], "properties": {"label": {"type": "string"}, "box": box}}
    opt_number = {"type": ["number", "null"]}
    strings = {"type": "array", "items": {"type": "string"}}
    click = {
        "type": ["object", "null"],
        "required": ["polarity", "point"],
        "properties": {
            "polarity": {"enum": ["positive", "negative"]},
            "point": {"type": "array", "items": number01, "minItems": 2, "maxItems": 2},
        },
    }
    step = {
        "type": "object",
        "required": ["step", "raw", "action", "click", "box", "box_grown", "mask", "iou", "problems", "seconds"],
        "properties": {
            "step": {"type": "integer", "minimum": 1},
            "raw": {"type": "string"},
            "action": {"enum": list(ACTIONS)},
            "click": click,
            "box": box,
            "box_grown": {"type": "boolean"},
            "mask": {"oneOf": [rle_, {"type": "null"}]},
            "iou": opt_number,
            "problems": strings,
            "seconds": {"type": "number", "minimum": 0},
        },
    }
    lesion = {
        "type": "object",
        "required": [
            "index",
            "label",
            "box",
            "initial_mask",
            "initial_iou",
            "steps",
            "end",
            "box_final",
            "mask",
            "iou",
        ],
        "properties": {
            "index": {"type": "integer", "minimum": 0},
            "label": {"type": "string"},
            "box": box,
            "initial_mask": rle_,
            "initial_iou": opt_number,
            "steps": {"type": "array", "items": step},
            "end": {"enum": list(ENDS)},
            "box_final": box,
            "mask": rle_,
            "iou": opt_number,
        },
    }
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": f"XFlow trace ({SCHEMA})",
        "type": "object",
        "required": [
            "schema",
            "created",
            "instruction",
            "image_size",
            "models",
            "settings",
            "stage1",
            "present",
            "lesions",
            "mask",
            "answer",
            "warnings",
            "timings",
            "batch",
        ],
        "properties": {
            "schema": {"const": SCHEMA},
            "created": {"type": "string"},
            "instruction": {
                "type": "object",
                "required": ["instruction", "finding", "regions", "level", "kind"],
                "properties": {
                    "instruction": {"type": "string"},
                    "finding": {"type": "string"},
                    "regions": strings,
                    "level": {"type": "string"},
                    "kind": {"type": "string"},
                },
            },
            "image_size": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 2, "maxItems": 2},
            "models": {"type": "object", "additionalProperties": {"type": "string"}},
            "settings": {"type": "object"},
            "stage1": {
                "type": "object",
                "required": ["raw", "think", "lungs", "present", "lesions", "problems"],
                "properties": {
                    "raw": {"type": "string"},
                    "think": {"type": "string"},
                    "lungs": {"type": "array", "items": grounded},
                    "present": {"type": ["boolean", "null"]},
                    "lesions": {"type": "array", "items": grounded},
                    "problems": strings,
                },
            },
            "present": {"type": "boolean"},
            "lesions": {"type": "array", "items": lesion},
            "mask": rle_,
            "answer": {"type": "string"},
            "warnings": strings,
            "timings": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0}},
            "batch": {
                "oneOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "required": ["index", "size"],
                        "properties": {"index": {"type": "integer"}, "size": {"type": "integer"}},
                    },
                ]
            },
            "stored": {
                "type": "object",
                "required": ["key", "created"],
                "properties": {"key": {"type": "string"}, "created": {"type": "string"}},
            },
        },
    }


# --- pictures -------------------------------------------------------------------------------

LUNG_COLOR = (80, 160, 255)
LESION_COLOR = (255, 200, 0)
MASK_COLOR = (255, 60, 60)


def render_trace(trace: Trace, image: NDArray[Any]) -> list[tuple[str, NDArray[np.uint8]]]:
    """Pictures of every step of a run, in the order the decisions were taken.

    Args:
        trace: the run's trace.
        image: the ``(H, W)`` float image in ``[0, 1]`` the run saw (same size as the trace).

    Returns:
        ``(name, rgb)`` pairs, ``rgb`` an ``(H, W, 3)`` uint8 array: ``"stage1"`` (lung boxes
        and lesion boxes), per lesion ``k`` ``"lesion{k}_step0"`` (initial mask and box) and
        ``"lesion{k}_step{t}"`` for each executed click (mask, grown box, clicks so far), then
        ``"final"`` (the answer mask).

    Raises:
        TraceError: the image size differs from the trace's.
    """
    return [(name, rgb) for name, _, rgb in _tiles(trace, image)]


def render_contact_sheet(
    trace: Trace, image: NDArray[Any], *, ncols: int = 4, tile_size: int = 320
) -> NDArray[np.uint8]:
    """One sheet with every picture of :func:`render_trace`, titled; ``(h, w, 3)`` uint8."""
    from monailabel_xflow import rendering

    tiles = _tiles(trace, image)
    legend = [("lung box", LUNG_COLOR), ("lesion box", LESION_COLOR), ("mask", MASK_COLOR)]
    return rendering.contact_sheet(
        [rgb for _, _, rgb in tiles], [title for _, title, _ in tiles], ncols=ncols, tile_size=tile_size, legend=legend
    )


def _tiles(trace: Trace, image: NDArray[Any]) -> list[tuple[str, str, NDArray[np.uint8]]]:
    from monailabel_xflow import rendering

    image = np.asarray(image)
    if tuple(image.shape[:2]) != tuple(trace.image_size):
        raise TraceError(f"image is {image.shape[:2]}, the trace was made on {tuple(trace.image_size)}")
    finding = trace.instruction.get("finding", "finding")
    tiles: list[tuple[str, str, NDArray[np.uint8]]] = []

    s1 = trace.stage1
    rgb = rendering.overlay(image, [])
    boxes = [b.box for b in s1.lungs] + [b.box for b in s1.lesions]
    colors = [LUNG_COLOR] * len(s1.lungs) + [LESION_COLOR] * len(s1.lesions)
    labels = [b.label for b in s1.lungs] + [b.label for b in s1.lesions]
    if boxes:
        rgb = rendering.draw_boxes(rgb, boxes, colors, labels)
    verdict = {True: "present", False: "absent", None: "unreadable"}[s1.present]
    tiles.append(("stage1", f"Stage 1: {finding} {verdict}, {len(s1.lesions)} box(es)", rgb))

    for lesion in trace.lesions:
        k = lesion.index
        title = f"lesion {k + 1} initial"
        if lesion.initial_iou is not None:
            title += f", IoU~{lesion.initial_iou:.2f}"
        tiles.append(
            (f"lesion{k + 1}_step0", title, _step_picture(rendering, image, lesion.initial_mask, lesion.box, []))
        )
        clicks: list[Click] = []
        for step in lesion.steps:
            if step.action != "click" or step.click is None or step.mask is None:
                continue
            clicks.append(step.click)
            sign = "+" if step.click.positive else "-"
            title = f"lesion {k + 1} step {step.step}: {sign}({step.click.x:.2f},{step.click.y:.2f})"
            if step.box_grown:
                title += " box grown"
            if step.iou is not None:
                title += f", IoU~{step.iou:.2f}"
            tiles.append(
                (f"lesion{k + 1}_step{step.step}", title, _step_picture(rendering, image, step.mask, step.box, clicks))
            )

    final = rendering.overlay(image, [rle.decode(trace.mask)], colors=[MASK_COLOR])
    tiles.append(("final", f"final: {trace.answer or ('present' if trace.present else 'absent')}", final))
    return tiles


def _step_picture(
    rendering: Any, image: NDArray[Any], mask_rle: Mapping[str, Any], box: Box, clicks: Sequence[Click]
) -> NDArray[np.uint8]:
    rgb: NDArray[np.uint8] = rendering.overlay(image, [rle.decode(mask_rle)], colors=[MASK_COLOR])
    rgb = rendering.draw_boxes(rgb, [box], [LESION_COLOR], [""])
    if clicks:
        rgb = rendering.draw_clicks(rgb, list(clicks))
    return rgb


# --- helpers --------------------------------------------------------------------------------


def _box(values: Any) -> Box:
    box = tuple(float(v) for v in values)
    if len(box) != 4:
        raise TraceError(f"a box has 4 values [x1, y1, x2, y2], got {values!r}")
    return (box[0], box[1], box[2], box[3])


def _plain(mask: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A mask's RLE as a plain dict (a :class:`~monailabel_xflow.rle.LazyRLE` is encoded here)."""
    return None if mask is None else dict(mask)


def _ref_to_dict(ref: BoxRef) -> dict[str, Any]:
    return {"label": ref.label, "box": [float(v) for v in ref.box]}


def _ref_from_dict(d: Mapping[str, Any]) -> BoxRef:
    return BoxRef(label=str(d["label"]), box=_box(d["box"]))


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _click_to_dict(click: Click | None) -> dict[str, Any] | None:
    if click is None:
        return None
    return {"polarity": "positive" if click.positive else "negative", "point": [float(click.x), float(click.y)]}


def _click_from_dict(d: Mapping[str, Any] | None) -> Click | None:
    if d is None:
        return None
    polarity = d.get("polarity")
    if polarity not in ("positive", "negative"):
        raise TraceError(f"click polarity must be 'positive' or 'negative', got {polarity!r}")
    x, y = (float(v) for v in d["point"])
    return Click(polarity == "positive", x, y)


__all__ = [
    "SCHEMA",
    "TraceError",
    "Stage1Record",
    "RevisionStep",
    "LesionRecord",
    "Trace",
    "json_schema",
    "render_trace",
    "render_contact_sheet",
]
