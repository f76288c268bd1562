"""The pluggable vision stages of the MIMIC-ILS pipeline and their phantom stand-ins.

Four roles, each a :class:`typing.Protocol`, so a hospital plugs in its own models
by naming a class in the stage configuration (:func:`load_stages`):

============  ==================  =====================================================
key           paper's model       contract
============  ==================  =====================================================
``anatomy``   HybridGNet          :class:`AnatomyStage`: right lung, left lung, heart
``healthy``   RadEdit             :class:`HealthyStage`: the lesion-free counterfactual
``locations`` CXAS                :class:`LocationStage`: a mask per location label
``detector``  VinDr-CXR YOLO      :class:`DetectorStage`: lesion boxes with confidences
============  ==================  =====================================================

Every mask is bool ``(H, W)`` on the radiograph's own pixel grid (row 0 at the top, the
patient's right lung on the image's left); images are uint8 ``(H, W)``; boxes are continuous
pixel ``(x1, y1, x2, y2)``.

Shipped implementations (``phantom``) run the pipeline end to end on a set written by
``xflow phantom``: they regenerate each phantom from ``ground-truth/phantoms.json`` and answer
from its own anatomy, a lesion-free rendering of the same chest
(``generate_phantom(..., healthy=True)``) and noisy boxes around its lesions.

Configuration (YAML or a dict), one key per stage; a value is ``phantom`` or
``package.module:Class`` (built with no arguments) or ``{class: ..., args: {...}}``::

    anatomy: phantom
    healthy: {class: my_site.radedit:RadEdit, args: {weights: /models/radedit}}
    locations: my_site.cxas:CXAS
    detector: my_site.yolo:VinDrYOLO

A missing stage raises :class:`StageError` naming it and its role.
"""

from __future__ import annotations

import importlib
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from monailabel_xflow.data.mimic_ils import LUNG_LOBES
from monailabel_xflow.errors import InputError
from monailabel_xflow.ils.masks import Detection
from monailabel_xflow.vocabulary import HEART, LEFT_LUNG, LUNGS, RIGHT_LUNG, ZONES

STAGE_ROLES: dict[str, str] = {
    "anatomy": "lungs and heart, the HybridGNet role",
    "healthy": "healthy counterfactual, the RadEdit role",
    "locations": "anatomy masks per location label, the CXAS role",
    "detector": "lesion boxes with confidences, the YOLO role",
}
"""Stage key -> its role, in pipeline order."""

HEALTHY_PROMPT = "No acute cardiopulmonary process"
"""The text prompt RadEdit is run with (the one it was trained on)."""

EXCLUDED_DETECTOR_LABELS = ("aortic enlargement", "other lesion", "pneumothorax")
"""VinDr-CXR classes the pipeline drops: not hyperintense lung lesions (paper App. A.3)."""


class StageError(InputError):
    """A stage that is not configured, cannot be built, or broke its contract."""


@dataclass(frozen=True)
class StudyImage:
    """One frontal radiograph going through the stages.

    Attributes:
        study: the study id (keys the MIMIC-ILS JSON).
        path: the image file.
        pixels: uint8 ``(H, W)``, MONOCHROME2 (air dark), not histogram-equalised.
    """

    study: str
    path: Path
    pixels: np.ndarray


@dataclass(frozen=True)
class Organs:
    """Lungs and heart of one image, bool ``(H, W)`` each."""

    right_lung: np.ndarray
    left_lung: np.ndarray
    heart: np.ndarray

    def lungs(self) -> dict[str, np.ndarray]:
        return {RIGHT_LUNG: self.right_lung, LEFT_LUNG: self.left_lung}

    def edit_region(self) -> np.ndarray:
        """Where the counterfactual may change the picture: lungs and heart."""
        return self.right_lung | self.left_lung | self.heart


@runtime_checkable
class AnatomyStage(Protocol):
    """The HybridGNet role: lungs and heart of the original image."""

    def organs(self, image: StudyImage) -> Organs:
        """Right lung, left lung and heart masks of ``image``."""


@runtime_checkable
class HealthyStage(Protocol):
    """The RadEdit role: the same image with its lesions removed."""

    def healthy(self, image: StudyImage, edit_region: np.ndarray) -> np.ndarray:
        """uint8 ``(H, W)`` counterfactual; pixels outside ``edit_region`` should be unchanged."""


@runtime_checkable
class LocationStage(Protocol):
    """The CXAS role, run on the counterfactual (lesions hide anatomy)."""

    def location_masks(self, image: StudyImage, healthy: np.ndarray, labels: Sequence[str]) -> dict[str, np.ndarray]:
        """A mask per label it can segment, among ``labels`` (zones, lungs, lobes, ``heart``,
        the 17 categories); labels it cannot segment are left out of the result."""


@runtime_checkable
class DetectorStage(Protocol):
    """The YOLO role: candidate lesion boxes with confidences."""

    def detect(self, image: StudyImage) -> list[Detection]:
        """Boxes on ``image``'s pixel grid; may include classes the pipeline then drops
        (:data:`EXCLUDED_DETECTOR_LABELS`)."""


@dataclass
class Stages:
    """The four configured stages."""

    anatomy: AnatomyStage
    healthy: HealthyStage
    locations: LocationStage
    detector: DetectorStage


# --- phantom stand-ins ----------------------------------------------------------------------

LOBE_ZONES: dict[str, tuple[str, ...]] = {
    "right upper lobe": ZONES[RIGHT_LUNG][:2],
    "right middle lobe": ZONES[RIGHT_LUNG][2:3],
    "right lower lobe": ZONES[RIGHT_LUNG][3:],
    "left upper lobe": ZONES[LEFT_LUNG][:3],
    "left lower lobe": ZONES[LEFT_LUNG][3:],
}
"""Frontal-projection stand-in for lobes on a phantom, which has zones only: the upper lobes over
the upper zones (the left with the lingula over the mid zone), the middle lobe over the right mid
zone, the lower lobes over the bases."""

VINDR_LABELS = {
    "pneumonia": "consolidation",
    "consolidation": "consolidation",
    "opacity": "lung opacity",
    "atelectasis": "atelectasis",
    "edema": "infiltration",
    "effusion": "pleural effusion",
}
"""VinDr-CXR class a detector would give each phantom finding."""


class PhantomSet:
    """Regenerates the phantoms of a set written by ``xflow phantom`` (one cached at a time).

    Args:
        root: the set's folder (holding ``ground-truth/phantoms.json``).

    Raises:
        StageError: no ``ground-truth/phantoms.json`` under ``root``.
    """

    def __init__(self, root: str | Path) -> None:
        from monailabel_xflow.data.export import GT_DIR, META_NAME

        self.root = Path(root)
        meta = self.root / GT_DIR / META_NAME
        if not meta.is_file():
            raise StageError(f"the phantom stages need a phantom set; {meta} not found")
        self.records = {Path(r["image"]).name: r for r in json.loads(meta.read_text())}
        self._cache: dict[tuple[str, bool], Any] = {}  # the current image only (both renderings)

    @staticmethod
    def is_phantom_set(root: str | Path) -> bool:
        from monailabel_xflow.data.export import GT_DIR, META_NAME

        return (Path(root) / GT_DIR / META_NAME).is_file()

    def _record(self, image: StudyImage) -> dict:
        rec = self.records.get(Path(image.path).name)
        if rec is None:
            raise StageError(f"{image.path} is not an image of the phantom set {self.root}")
        return rec

    def phantom(self, image: StudyImage, healthy: bool = False):
        """The :class:`~monailabel_xflow.data.phantom.Phantom` drawn for ``image`` (or its healthy twin)."""
        from monailabel_xflow.data.export import scheduled_findings
        from monailabel_xflow.data.phantom import generate_phantom

        key = (str(image.path), healthy)
        if key in self._cache:
            return self._cache[key]
        rec = self._record(image)
        index = int(Path(rec["image"]).stem.rsplit("_", 1)[1])  # phantom_<seed>_<index>.png
        findings = scheduled_findings(index, np.random.default_rng(rec["seed"]))
        ph = generate_phantom(rec["seed"], size=rec["size"], findings=findings, healthy=healthy)
        if ph.image.shape != image.pixels.shape:
            raise StageError(
                f"{image.path}: the regenerated phantom is {ph.image.shape}, the file {image.pixels.shape}"
            )
        if any(k[0] != key[0] for k in self._cache):
            self._cache.clear()
        self._cache[key] = ph
        return ph


class PhantomAnatomy:
    """HybridGNet stand-in: the phantom's own lungs and heart."""

    def __init__(self, phantoms: PhantomSet) -> None:
        self.phantoms = phantoms

    def organs(self, image: StudyImage) -> Organs:
        ph = self.phantoms.phantom(image)
        return Organs(ph.lungs[RIGHT_LUNG], ph.lungs[LEFT_LUNG], ph.heart)


class PhantomHealthy:
    """RadEdit stand-in: the same chest rendered without its lesions, quantised like the PNG."""

    def __init__(self, phantoms: PhantomSet) -> None:
        self.phantoms = phantoms

    def healthy(self, image: StudyImage, edit_region: np.ndarray) -> np.ndarray:
        from monailabel_xflow.data.export import quantize

        _, v8 = quantize(self.phantoms.phantom(image, healthy=True).image)
        return np.where(edit_region, v8, image.pixels)


class PhantomLocations:
    """CXAS stand-in: zones and lungs of the phantom, lobes from :data:`LOBE_ZONES`, the heart,
    and ``lung`` (both lungs); other categories are not segmented."""

    def __init__(self, phantoms: PhantomSet) -> None:
        self.phantoms = phantoms

    def location_masks(self, image: StudyImage, healthy: np.ndarray, labels: Sequence[str]) -> dict[str, np.ndarray]:
        ph = self.phantoms.phantom(image)
        out = {}
        for label in labels:
            if label in ph.zones:
                out[label] = ph.zones[label]
            elif label in ph.lungs:
                out[label] = ph.lungs[label]
            elif label in LUNG_LOBES:
                out[label] = np.logical_or.reduce([ph.zones[z] for z in LOBE_ZONES[label]])
            elif label == HEART:
                out[label] = ph.heart
            elif label == "lung":
                out[label] = ph.lungs[RIGHT_LUNG] | ph.lungs[LEFT_LUNG]
        return out


class PhantomDetector:
    """YOLO stand-in: noisy boxes around the phantom's lesions, plus false alarms.

    Each 8-connected component of a lung lesion (larger than ``min_area`` of the image) gets a
    box with every edge moved by a normal draw of ``jitter`` times the box side, and a confidence
    drawn uniformly from ``confidence``; a study gets a low-confidence false box in a random lung
    with probability ``false_rate``. Draws are seeded by the study id, so runs repeat exactly.

    Args:
        miss_rate: probability that a lesion component gets no box at all.
    """

    def __init__(
        self,
        phantoms: PhantomSet,
        jitter: float = 0.12,
        confidence: tuple[float, float] = (0.05, 0.95),
        false_rate: float = 0.3,
        miss_rate: float = 0.1,
        min_area: float = 0.0005,
    ) -> None:
        self.phantoms = phantoms
        self.jitter, self.confidence = jitter, confidence
        self.false_rate, self.miss_rate, self.min_area = false_rate, miss_rate, min_area

    def detect(self, image: StudyImage) -> list[Detection]:
        from monailabel_xflow.geometry import connected_components

        ph = self.phantoms.phantom(image)
        h, w = image.pixels.shape
        rng = np.random.default_rng(zlib.crc32(image.study.encode()))
        out = []
        for les in ph.lesions:
            if les.finding == "cardiomegaly":
                continue
            for comp in connected_components(les.mask, min_area_px=max(1, int(self.min_area * h * w))):
                if rng.random() < self.miss_rate:
                    continue
                rows, cols = np.flatnonzero(comp.any(axis=1)), np.flatnonzero(comp.any(axis=0))
                x1, y1, x2, y2 = cols[0], rows[0], cols[-1] + 1.0, rows[-1] + 1.0
                bw, bh = x2 - x1, y2 - y1
                d = rng.normal(0.0, self.jitter, 4) * np.array([bw, bh, bw, bh])
                box = (
                    float(np.clip(x1 + d[0], 0, w)),
                    float(np.clip(y1 + d[1], 0, h)),
                    float(np.clip(x2 + d[2], 0, w)),
                    float(np.clip(y2 + d[3], 0, h)),
                )
                if box[2] - box[0] < 1 or box[3] - box[1] < 1:
                    continue
                out.append(Detection(box, float(rng.uniform(*self.confidence)), VINDR_LABELS[les.finding]))
        if rng.random() < self.false_rate:
            lung = ph.lungs[LUNGS[int(rng.integers(2))]]
            rows, cols = np.flatnonzero(lung.any(axis=1)), np.flatnonzero(lung.any(axis=0))
            cy, cx = rng.uniform(rows[0], rows[-1]), rng.uniform(cols[0], cols[-1])
            s = rng.uniform(0.05, 0.15) * h
            out.append(
                Detection(
                    (float(max(0, cx - s)), float(max(0, cy - s)), float(min(w, cx + s)), float(min(h, cy + s))),
                    float(rng.uniform(0.02, 0.4)),
                    "lung opacity",
                )
            )
        return out


PHANTOM_STAGES = {
    "anatomy": PhantomAnatomy,
    "healthy": PhantomHealthy,
    "locations": PhantomLocations,
    "detector": PhantomDetector,
}
PROTOCOLS = {"anatomy": AnatomyStage, "healthy": HealthyStage, "locations": LocationStage, "detector": DetectorStage}


def _build(key: str, spec: Any, phantoms: PhantomSet | None) -> Any:
    args: Mapping[str, Any] = {}
    if isinstance(spec, Mapping):
        args = spec.get("args") or {}
        spec = spec.get("class")
    if spec == "phantom":
        if phantoms is None:
            raise StageError(f"stage {key!r} ({STAGE_ROLES[key]}) is 'phantom' but the images are not a phantom set")
        return PHANTOM_STAGES[key](phantoms, **args)
    if not isinstance(spec, str) or ":" not in spec:
        raise StageError(
            f"stage {key!r} ({STAGE_ROLES[key]}): expected 'phantom' or 'package.module:Class', got {spec!r}"
        )
    module_name, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise StageError(f"stage {key!r} ({STAGE_ROLES[key]}): cannot import {spec!r}: {err}") from err
    try:
        stage = cls(**args)
    except Exception as err:  # a user's model failing to load: say which stage
        raise StageError(f"stage {key!r} ({STAGE_ROLES[key]}): {spec} failed to build: {err}") from err
    if not isinstance(stage, PROTOCOLS[key]):
        raise StageError(f"stage {key!r} ({STAGE_ROLES[key]}): {spec} lacks the method of {PROTOCOLS[key].__name__}")
    return stage


def load_stages(config: str | Path | Mapping[str, Any] | None, images_root: str | Path | None = None) -> Stages:
    """Build the four stages from a configuration (format in the module docstring).

    Args:
        config: a YAML file, a mapping, or None: every stage ``phantom`` when ``images_root`` is
            a phantom set, else an error.
        images_root: the images' folder (a phantom set enables the ``phantom`` stages).

    Raises:
        StageError: a stage missing from the configuration, unknown, or failing to build; the
            message names the stage and its role.
    """
    phantoms = PhantomSet(images_root) if images_root is not None and PhantomSet.is_phantom_set(images_root) else None
    if config is None:
        if phantoms is None:
            raise StageError(
                f"no stage configuration: {images_root} is not a phantom set, so real models are needed; "
                f"write a YAML with the keys {', '.join(STAGE_ROLES)} (first missing: 'anatomy', "
                f"{STAGE_ROLES['anatomy']}) and pass it with --stages"
            )
        config = {key: "phantom" for key in STAGE_ROLES}
    elif not isinstance(config, Mapping):
        import yaml

        path = Path(config)
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise StageError(f"cannot read the stage configuration {path}: {err}") from err
        if not isinstance(config, Mapping):
            raise StageError(f"{path}: expected a mapping with keys {', '.join(STAGE_ROLES)}")
    unknown = sorted(set(config) - set(STAGE_ROLES))
    if unknown:
        raise StageError(f"unknown stage key(s) {unknown}; the stages are {', '.join(STAGE_ROLES)}")
    for key, role in STAGE_ROLES.items():
        if not config.get(key):
            raise StageError(
                f"stage {key!r} ({role}) is not configured; add '{key}: package.module:Class' "
                f"(or '{key}: phantom' for a phantom set) to the stage configuration"
            )
    return Stages(**{key: _build(key, config[key], phantoms) for key in STAGE_ROLES})
