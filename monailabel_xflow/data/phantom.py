"""A procedural frontal chest radiograph with pixel-true ground truth (no real data needed).

:func:`generate_phantom` draws, deterministically from one integer seed, a PA or AP chest
radiograph together with the masks XFlow is trained and scored on: both lungs, the eight lung
zones, the heart, and one mask per lesion for any of the seven findings of
:data:`~monailabel_xflow.vocabulary.FINDINGS`.

How it is built (all shapes are analytic functions of normalised coordinates, so the masks at full
resolution and the picture come from the same geometry):

1. **Plan**: which findings, on which side, and what they do to the anatomy (atelectasis raises
   its hemidiaphragm: volume loss; cardiomegaly widens the heart; an AP view magnifies it).
2. **Anatomy masks** at full resolution: each lung is bounded by a lateral chest-wall curve and a
   medial mediastinal curve (both functions of the row), by a diaphragm dome (a function of the
   column) that meets the lateral wall in a sharp costophrenic angle, and loses the pixels of the
   heart, an ellipse sitting on the diaphragm and shifted to the patient's left.
3. **Zones**: each lung is cut into four bands by the vertical quartiles of its own extent, rows
   ``r0..r1`` (inclusive): zone ``k`` (apical, upper, mid, base) holds the lung pixels of rows
   ``[r0 + k*n/4, r0 + (k+1)*n/4)`` with ``n = r1 - r0 + 1`` (integer floor). The four zones
   partition the lung exactly. (CXAS zones follow rib levels; quartiles are a documented
   stand-in.)
4. **Lesions**: a smooth random field per lesion at low resolution, upsampled; the mask is where
   the field passes a threshold, intersected with its lung (every lesion except cardiomegaly lies
   inside exactly one lung; bilateral edema and effusion are one lesion per lung). Effusion is
   everything in its lung below a meniscus that rises laterally, so it always holds the
   costophrenic angle (the lung's lowest row) and the base zone; it is drawn first and the other
   lesions are kept out of the fluid (which hides them on the picture too). A lesion's ``zones``
   are the zones it has at least one pixel in, apex to base.
   The heart's width is set from a drawn cardiothoracic ratio: 0.36-0.42 (x1.06 on AP, capped at
   0.43) without cardiomegaly, 0.55-0.66 with it; :attr:`Phantom.ctr` is re-measured on the masks.
5. **Picture**: an attenuation map (soft tissue, mediastinum, spine, ribs, clavicles, lung air
   with vessel markings, abdomen, lesions) rendered at half resolution, blurred, upsampled,
   mapped through an exposure curve and given quantum noise. MONOCHROME2 convention: air is
   dark, bone and soft tissue bright.

Sides are the patient's: the patient's right lung is on the image's left.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image
from scipy import ndimage

from monailabel_xflow.data import PHANTOM_MAX_SIZE, PHANTOM_MIN_SIZE
from monailabel_xflow.errors import InputError
from monailabel_xflow.vocabulary import FINDINGS, LEFT_LUNG, LUNGS, RIGHT_LUNG, ZONES

CTR_NORMAL_MAX = 0.45
"""A heart without cardiomegaly never exceeds this cardiothoracic ratio (MIMIC-ILS negatives)."""

CTR_ENLARGED_MIN = 0.52
"""Cardiomegaly is drawn with a cardiothoracic ratio at least this (clinical cut-off 0.5)."""

VIEWS = ("PA", "AP")


class PhantomError(InputError):
    """Bad generator arguments: unknown finding, size too small, unknown view."""


@dataclass
class Lesion:
    """One lesion of a phantom.

    Attributes:
        finding: one of :data:`~monailabel_xflow.vocabulary.FINDINGS`.
        mask: bool ``(H, W)``; the heart for cardiomegaly, else a subset of one lung.
        zones: the zones (:data:`~monailabel_xflow.vocabulary.ALL_ZONES` strings) holding at least
            one pixel of the mask, apex to base; ``()`` for cardiomegaly.
        lung: the lung holding the lesion, ``None`` for cardiomegaly.
        confident: whether a report would call it definite ("highly suggestive of") rather than
            tentative ("possibly reflects"); used by lesion-inference answers.
    """

    finding: str
    mask: np.ndarray
    zones: tuple[str, ...]
    lung: str | None = None
    confident: bool = True


@dataclass
class Phantom:
    """A synthetic frontal chest radiograph and its ground truth.

    Attributes:
        seed: the seed it was drawn from.
        image: float32 ``(H, W)`` in ``[0, 1]``, MONOCHROME2 (air dark).
        lungs: ``{"right lung", "left lung"}`` -> bool ``(H, W)``; patient sides (right lung on
            the image left).
        zones: the eight zone strings -> bool ``(H, W)``; four per lung, partitioning it.
        heart: bool ``(H, W)``, disjoint from the lungs.
        lesions: the lesions, in the order drawn.
        view: ``"PA"`` or ``"AP"``.
        ctr: cardiothoracic ratio measured on the masks (heart width / widest lung-to-lung width).
        pixel_spacing_mm: square pixel side in millimetres (a ~400 mm detector).
    """

    seed: int
    image: np.ndarray
    lungs: dict[str, np.ndarray]
    zones: dict[str, np.ndarray]
    heart: np.ndarray
    lesions: list[Lesion] = field(default_factory=list)
    view: str = "PA"
    ctr: float = 0.0
    pixel_spacing_mm: float = 0.4

    @property
    def findings(self) -> tuple[str, ...]:
        """Findings present, in vocabulary order."""
        present = {les.finding for les in self.lesions}
        return tuple(f for f in FINDINGS if f in present)

    def finding_mask(self, finding: str, region: str | None = None) -> np.ndarray:
        """Union of the masks of ``finding``, optionally restricted to a lung or zone."""
        out = np.zeros(self.image.shape, bool)
        for les in self.lesions:
            if les.finding == finding:
                out |= les.mask
        if region is not None:
            out &= self.lungs[region] if region in self.lungs else self.zones[region]
        return out

    def occupied_zones(self, finding: str | None = None) -> tuple[str, ...]:
        """Zones holding any pixel of ``finding`` (any lung lesion if None), apex to base."""
        hit: set[str] = set()
        for les in self.lesions:
            if finding is None or les.finding == finding:
                hit.update(les.zones)
        return tuple(z for lung in LUNGS for z in ZONES[lung] if z in hit)


# --- small helpers --------------------------------------------------------------------------


def _grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Normalised pixel-centre coordinates: ``y`` as a column ``(n, 1)``, ``x`` as a row ``(1, n)``."""
    c = (np.arange(n, dtype=np.float32) + 0.5) / n
    return c[:, None], c[None, :]


def _resize(a: np.ndarray, n: int) -> np.ndarray:
    """Bilinear pixel-centre-aligned resize of a float field to ``(n, n)``."""
    if a.shape[0] == n:
        return a.astype(np.float32, copy=False)
    return np.asarray(Image.fromarray(a.astype(np.float32), mode="F").resize((n, n), Image.Resampling.BILINEAR))


def _smooth_noise(rng: np.random.Generator, n: int, sigma: float) -> np.ndarray:
    """Zero-mean unit-std Gaussian-filtered white noise ``(n, n)``."""
    a = ndimage.gaussian_filter(rng.standard_normal((n, n)).astype(np.float32), sigma, mode="wrap")
    return a / (a.std() + 1e-6)


def _smoothstep(t: np.ndarray) -> np.ndarray:
    t = np.clip(t, 0.0, 1.0)
    return t * t * (3 - 2 * t)


# --- plan -----------------------------------------------------------------------------------


@dataclass
class _Side:
    """Geometry of one hemithorax, in normalised distance ``d`` from the midline."""

    apex_y: float  # top of the lung
    cp_y: float  # costophrenic angle (lowest lung point, lateral)
    lat_d: float  # widest lateral reach
    dome_h: float  # dome height above the costophrenic angle
    dome_peak: float  # d of the dome's top
    med_top: float  # mediastinal half-width above the heart
    knob: float  # extra medial bulge (aortic knob on the left, SVC on the right)
    shoulder: float  # roundness of the apex

    def _t(self, y: np.ndarray) -> np.ndarray:
        return np.clip((y - self.apex_y) / (self.cp_y - self.apex_y), 0, 1)

    def lateral(self, y: np.ndarray) -> np.ndarray:
        """Chest-wall border ``d`` at rows ``y``: out from the apex, widest at the base."""
        t = self._t(y)
        a = np.clip(t / self.shoulder, 0, 1)
        rise = np.sqrt(1 - (1 - a) ** 2)  # quarter circle: a rounded apex
        apex_d = self.med_top + 0.1
        return apex_d + (self.lat_d * (0.9 + 0.1 * t) - apex_d) * rise

    def medial(self, y: np.ndarray) -> np.ndarray:
        """Mediastinal border ``d`` at rows ``y`` (the heart is cut out separately)."""
        t = self._t(y)
        a = np.clip(t / (0.6 * self.shoulder), 0, 1)
        apex_d = self.med_top + 0.1
        k = self.knob * np.exp(-(((y - self.apex_y - 0.17) / 0.045) ** 2))
        return self.med_top + (apex_d - self.med_top) * (1 - np.sqrt(1 - (1 - a) ** 2)) + k

    def dome(self, d: np.ndarray) -> np.ndarray:
        """Diaphragm row at distance ``d`` from the midline (lung lies above it)."""
        top = self.cp_y - self.dome_h
        w = self.lat_d - self.dome_peak
        lateral = top + self.dome_h * ((d - self.dome_peak) / w) ** 2
        medial = top + 0.12 * self.dome_h * ((self.dome_peak - d) / self.dome_peak) ** 2
        return np.where(d >= self.dome_peak, lateral, medial)


def _plan(rng: np.random.Generator, findings: tuple[str, ...] | None) -> tuple[list[tuple[str, str]], dict]:
    """Choose the lesions ``(finding, lung)`` and the anatomy parameters they imply."""
    if findings is None:
        if rng.random() < 0.2:
            findings = ()
        else:
            k = int(rng.choice([1, 2, 3], p=[0.45, 0.35, 0.2]))
            findings = tuple(rng.choice(FINDINGS, size=k, replace=False))
    unknown = [f for f in findings if f not in FINDINGS]
    if unknown:
        raise PhantomError(f"unknown finding(s) {unknown}; supported: {', '.join(FINDINGS)}")
    lesions: list[tuple[str, str]] = []
    for f in dict.fromkeys(findings):
        if f == "cardiomegaly":
            lesions.append((f, ""))
        elif f == "edema":
            lesions += [(f, RIGHT_LUNG), (f, LEFT_LUNG)]
        elif f == "effusion":
            sides = list(LUNGS) if rng.random() < 0.35 else [LUNGS[rng.integers(2)]]
            lesions += [(f, s) for s in sides]
        elif f == "atelectasis":
            lesions.append((f, LUNGS[rng.integers(2)]))
        else:
            n = 1 if rng.random() < 0.6 else 2
            lesions += [(f, LUNGS[rng.integers(2)]) for _ in range(n)]
    return lesions, {"cardiomegaly": "cardiomegaly" in findings}


def _sides(rng: np.random.Generator, lesions, view: str) -> dict[str, _Side]:
    u = rng.uniform
    apex = u(0.085, 0.13)
    base = u(0.76, 0.84) - (0.03 if view == "AP" else 0.0)  # AP: supine, shallower inspiration
    lat = u(0.33, 0.38)
    sides = {}
    for lung in LUNGS:
        right = lung == RIGHT_LUNG
        cp = base - (u(0.005, 0.03) if right else 0.0)  # the liver lifts the right dome
        if any(f == "atelectasis" and s == lung for f, s in lesions):
            cp -= u(0.03, 0.05)  # volume loss: the hemidiaphragm rises
        sides[lung] = _Side(
            apex_y=apex + u(-0.01, 0.01),
            cp_y=cp,
            lat_d=lat + u(-0.012, 0.012),
            dome_h=u(0.06, 0.1),
            dome_peak=u(0.15, 0.2),
            med_top=u(0.055, 0.075),
            knob=u(0.0, 0.015) if right else u(0.02, 0.035),
            shoulder=u(0.28, 0.4),
        )
    return sides


# --- anatomy masks --------------------------------------------------------------------------


def _side_d(x: np.ndarray, lung: str) -> np.ndarray:
    """Distance from the midline towards ``lung``'s side (patient right = image left)."""
    return (0.5 - x) if lung == RIGHT_LUNG else (x - 0.5)


def _dome_row(sides: dict[str, _Side], x: np.ndarray) -> np.ndarray:
    """Diaphragm row for every column: each side's dome on its half, blended across the
    midline (|x - 0.5| < 0.04, medial to every lung) so the two domes meet without a step."""
    right = sides[RIGHT_LUNG].dome(np.abs(0.5 - x))
    left = sides[LEFT_LUNG].dome(np.abs(x - 0.5))
    w = _smoothstep((x - 0.46) / 0.08)
    return right * (1 - w) + left * w


def _heart_geometry(rng: np.random.Generator, sides: dict[str, _Side], enlarged: bool, view: str) -> dict:
    thorax = sides[RIGHT_LUNG].lat_d + sides[LEFT_LUNG].lat_d
    if enlarged:
        ctr = rng.uniform(CTR_ENLARGED_MIN + 0.03, 0.66)
    else:
        ctr = rng.uniform(0.36, 0.42) * (1.06 if view == "AP" else 1.0)  # AP magnifies the heart
        ctr = min(ctr, CTR_NORMAL_MAX - 0.02)
    width = ctr * thorax
    right_share = rng.uniform(0.3, 0.38)
    bottom = sides[LEFT_LUNG].cp_y - sides[LEFT_LUNG].dome_h + 0.02
    ry = width * rng.uniform(0.5, 0.62) + 0.04
    return {
        "xc": 0.5 - right_share * width + width / 2,
        "rx": width / 2,
        "yc": bottom - 0.1 * ry,
        "ry": ry,
        "tilt": rng.uniform(0.15, 0.35),
    }


def _heart_mask(h: dict, sides: dict[str, _Side], y: np.ndarray, x: np.ndarray) -> np.ndarray:
    # a tilted ellipse (apex down and to the patient's left), cut by the diaphragm; its axes
    # are scaled so that its horizontal half-extent is exactly rx
    c, s = np.cos(h["tilt"]), np.sin(h["tilt"])
    ea, eb = h["rx"], h["ry"]
    k = h["rx"] / np.sqrt((ea * c) ** 2 + (eb * s) ** 2)
    ea, eb = ea * k, eb * k
    dx, dy = x - h["xc"], y - h["yc"]
    a = (c * dx + s * dy) / ea
    b = (-s * dx + c * dy) / eb
    return (a * a + b * b <= 1.0) & (y < _dome_row(sides, x))


def _lung_masks(sides: dict[str, _Side], heart: np.ndarray, y: np.ndarray, x: np.ndarray) -> dict[str, np.ndarray]:
    lungs = {}
    for lung, sd in sides.items():
        d = _side_d(x, lung)
        m = (d >= sd.medial(y)) & (d <= sd.lateral(y)) & (y >= sd.apex_y) & (y <= sd.dome(d))
        lungs[lung] = m & ~heart
    return lungs


def zone_masks(lungs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The eight zones: vertical quartiles of each lung's row extent (see module docstring)."""
    zones = {}
    for lung, mask in lungs.items():
        rows = np.flatnonzero(mask.any(axis=1))
        r0, n = int(rows[0]), int(rows[-1] - rows[0] + 1)
        cuts = [r0 + (k * n) // 4 for k in range(5)]
        for k, name in enumerate(ZONES[lung]):
            z = np.zeros_like(mask)
            z[cuts[k] : cuts[k + 1]] = mask[cuts[k] : cuts[k + 1]]
            zones[name] = z
    return zones


def cardiothoracic_ratio(lungs: dict[str, np.ndarray], heart: np.ndarray) -> float:
    """Heart width over the widest outer lung-to-lung width, both in columns, on the masks."""
    both = lungs[RIGHT_LUNG] | lungs[LEFT_LUNG]
    cols = np.flatnonzero(both.any(axis=0))
    hcols = np.flatnonzero(heart.any(axis=0))
    return float((hcols[-1] - hcols[0] + 1) / (cols[-1] - cols[0] + 1))


# --- lesions --------------------------------------------------------------------------------


def _zones_of(mask: np.ndarray, zones: dict[str, np.ndarray], lung: str) -> tuple[str, ...]:
    return tuple(z for z in ZONES[lung] if (mask & zones[z]).any())


def _point_in(rng: np.random.Generator, region: np.ndarray, lo_frac: float = 0.1, hi_frac: float = 0.9):
    """A random normalised ``(y, x)`` inside ``region``, away from its horizontal edges."""
    n = region.shape[0]
    rows = np.flatnonzero(region.any(axis=1))
    r = int(rows[rng.integers(len(rows))])
    cols = np.flatnonzero(region[r])
    c = cols[int(len(cols) * rng.uniform(lo_frac, hi_frac))]
    return (r + 0.5) / n, (c + 0.5) / n


def _blob_field(rng, lo: int, cy: float, cx: float, radius: float, lobes: int, roughness: float) -> np.ndarray:
    """Smooth positive field at ``lo`` resolution peaking ~1 near ``(cy, cx)``."""
    y, x = _grid(lo)
    f = np.zeros((lo, lo), np.float32)
    for i in range(lobes):
        oy, ox = rng.normal(0, 0.5 * radius, 2) if i else (0.0, 0.0)
        sy, sx = radius * rng.uniform(0.6, 1.2, 2)
        f = np.maximum(f, np.exp(-(((y - cy - oy) / sy) ** 2 + ((x - cx - ox) / sx) ** 2) / 2))
    return f * (1 + roughness * _smooth_noise(rng, lo, max(1.0, lo / 60)))


def _band_field(lo: int, p0, p1, width: float) -> np.ndarray:
    """Field ``exp(-dist^2/2w^2)`` to the segment ``p0-p1`` (``(y, x)`` normalised)."""
    y, x = _grid(lo)
    (y0, x0), (y1, x1) = p0, p1
    vy, vx = y1 - y0, x1 - x0
    t = np.clip(((y - y0) * vy + (x - x0) * vx) / max(vy * vy + vx * vx, 1e-9), 0, 1)
    dist2 = (y - y0 - t * vy) ** 2 + (x - x0 - t * vx) ** 2
    return np.exp(-dist2 / (2 * width * width)).astype(np.float32)


def _lesion_field(rng, finding: str, lung: str, sides, zones, lo: int):
    """Return ``(field at lo res, threshold, density gain)`` for one lung lesion."""
    sd = sides[lung]
    zone_list = ZONES[lung]
    sign = -1.0 if lung == RIGHT_LUNG else 1.0
    if finding == "effusion":
        return None, 0.0, 0.0  # drawn from the anatomy directly (meniscus), see _effusion
    if finding == "edema":
        # perihilar "bat wing": wide haze around the hilum, fading to the periphery
        cy = sd.apex_y + 0.42 * (sd.cp_y - sd.apex_y)
        cx = 0.5 + sign * (sd.med_top + 0.08)
        y, x = _grid(lo)
        f = np.exp(-(((y - cy) / rng.uniform(0.13, 0.18)) ** 2 + ((x - cx) / rng.uniform(0.09, 0.12)) ** 2) / 2)
        f = f * (1 + 0.25 * _smooth_noise(rng, lo, lo / 40))
        return f.astype(np.float32), rng.uniform(0.35, 0.5), rng.uniform(0.12, 0.18)
    if finding == "atelectasis":
        if rng.random() < 0.55:  # plate-like band, mid or lower zone, roughly horizontal
            zone = zones[zone_list[int(rng.integers(2, 4))]]
            cy, cx = _point_in(rng, zone, 0.35, 0.65)
            half = rng.uniform(0.06, 0.12)
            ang = rng.uniform(-0.35, 0.35)
            p0 = (cy - half * np.sin(ang), cx - half * np.cos(ang))
            p1 = (cy + half * np.sin(ang), cx + half * np.cos(ang))
            f = _band_field(lo, p0, p1, rng.uniform(0.01, 0.02))
            return f * (1 + 0.2 * _smooth_noise(rng, lo, lo / 80)), 0.4, rng.uniform(0.16, 0.24)
        # wedge: a triangle-ish opacity from the hilum towards the base, lateral
        hy = sd.apex_y + 0.45 * (sd.cp_y - sd.apex_y)
        hx = 0.5 + sign * (sd.med_top + 0.03)
        ty = sd.cp_y - rng.uniform(0.02, 0.06)
        tx = 0.5 + sign * sd.lat_d * rng.uniform(0.55, 0.85)
        f = np.zeros((lo, lo), np.float32)
        for k, w in enumerate(np.linspace(0.012, 0.05, 5)):
            t = k / 4
            f = np.maximum(
                f, _band_field(lo, (hy, hx), (hy + t * (ty - hy), hx + t * (tx - hx) * 0.4 + (tx - hx) * 0.6 * t), w)
            )
        return f * (1 + 0.15 * _smooth_noise(rng, lo, lo / 60)), 0.45, rng.uniform(0.18, 0.28)
    # patches: pneumonia / consolidation / opacity in 1-2 adjacent zones
    weights = {
        "pneumonia": [0.1, 0.2, 0.35, 0.35],
        "consolidation": [0.1, 0.25, 0.35, 0.3],
        "opacity": [0.2, 0.3, 0.3, 0.2],
    }[finding]
    zone = zones[zone_list[int(rng.choice(4, p=weights))]]
    cy, cx = _point_in(rng, zone)
    radius = float(np.exp(rng.uniform(np.log(0.018), np.log(0.07))))
    lobes = int(rng.integers(1, 5))
    rough = 0.45 if finding == "opacity" else 0.25
    gain = {"pneumonia": (0.2, 0.28), "consolidation": (0.24, 0.32), "opacity": (0.14, 0.22)}[finding]
    return _blob_field(rng, lo, cy, cx, radius, lobes, rough), 0.35, rng.uniform(*gain)


def _effusion(rng, lung: str, sd: _Side, lungs, y: np.ndarray, x: np.ndarray):
    """Pleural fluid in the dependent lung: everything below a meniscus that rises laterally.

    Returns:
        ``(mask, boundary)``: the bool mask at full resolution and ``boundary(x) -> row`` (both
        normalised), the fluid's upper edge, shared with the renderer.
    """
    rows = np.flatnonzero(lungs[lung].any(axis=1))
    top, bottom = rows[0] / y.shape[0], (rows[-1] + 1) / y.shape[0]
    level = (sd.cp_y - sd.dome_h) - rng.uniform(0.06, 0.3) * (bottom - top)  # above the dome top
    inner = float(sd.medial(np.asarray(level, np.float32)))
    meniscus = rng.uniform(0.05, 0.1)

    def boundary(xx: np.ndarray) -> np.ndarray:
        u = np.clip((_side_d(xx, lung) - inner) / (sd.lat_d - inner), 0, 1)
        return level - meniscus * u**2.2

    return lungs[lung] & (y >= boundary(x)), boundary


# --- picture --------------------------------------------------------------------------------


def _rib_layer(rng, sides, y, x) -> np.ndarray:
    """Posterior and anterior ribs plus clavicles as bright bands with cortical rims."""
    n = y.shape[0]
    out = np.zeros((n, n), np.float32)

    def band(center: np.ndarray, half: float, cols: np.ndarray, gain: float):
        # center: row (normalised) of the band's centre line at each column in cols
        for j0 in range(0, len(cols), 256):
            cc = cols[j0 : j0 + 256]
            cy = center[j0 : j0 + 256]
            r0 = max(0, int((cy.min() - half) * n) - 1)
            r1 = min(n, int((cy.max() + half) * n) + 2)
            if r1 <= r0:
                continue
            t = np.abs(y[r0:r1] - cy[None, :]) / half
            prof = np.where(t < 1, 0.55 + 0.45 * np.exp(-(((t - 0.82) / 0.13) ** 2)), 0.0)
            out[r0:r1, cc] += gain * prof

    xs = x[0]
    for lung, sd in sides.items():
        d = _side_d(xs, lung)
        span = sd.cp_y - sd.apex_y
        step = span / rng.uniform(8.6, 9.4)
        L = sd.lat_d + 0.03
        inside = (d > 0.025) & (d < L)
        cols = np.flatnonzero(inside)
        u = d[cols] / L
        for i in range(11):
            y0 = sd.apex_y - 0.03 + i * step
            # posterior rib: from the spine rising a little, then sweeping down the chest wall
            post = y0 - 0.035 * u + (0.13 + 0.012 * i) * u**2.2
            band(post, 0.0085 + 0.0006 * i, cols, 0.09)
            # anterior rib: from the chest wall downwards to the costal cartilage (invisible)
            acols = cols[u > 0.3]
            ua = d[acols] / L
            ant = y0 + 0.06 + 0.13 * (1 - ua) ** 1.3 + 0.03 * (ua > 0.9) * (ua - 0.9) * 10
            band(ant, 0.007, acols, 0.035)
        # clavicle: from the sternal notch out to the shoulder, slightly S-shaped
        ccols = cols[(u > 0.08) & (u < 1.05)]
        uc = d[ccols] / L
        cl_y = sd.apex_y + 0.045 - 0.05 * uc + 0.015 * np.sin(np.pi * uc)
        band(cl_y, 0.016, ccols, 0.22)
    return out


def _branches(rng, img: np.ndarray, starts, length: float, max_depth: int, spread: float = 0.4) -> None:
    """Draw random branching trees (1-px lines, weight halving down the tree) into ``img``.

    Args:
        starts: ``(y, x, angle)`` normalised roots; angle in radians, 0 pointing to +x.
        length: first segment length (normalised); each generation is 15 % shorter.
    """
    from skimage.draw import line

    n = img.shape[0]
    stack = [(y, x, a, 1.0, 0) for y, x, a in starts]
    while stack:
        py, px, ang, w, depth = stack.pop()
        ang += rng.normal(0, 0.15)
        seg = rng.uniform(0.6, 1.2) * length * (0.85**depth)
        qy, qx = py + seg * np.sin(ang), px + seg * np.cos(ang)
        rr, cc = line(
            int(np.clip(py, 0, 0.999) * n),
            int(np.clip(px, 0, 0.999) * n),
            int(np.clip(qy, 0, 0.999) * n),
            int(np.clip(qx, 0, 0.999) * n),
        )
        img[rr, cc] += w
        if depth < max_depth and w > 0.2:
            for _ in range(2):
                stack.append((qy, qx, ang + rng.normal(0, spread), w * 0.72, depth + 1))


def _hilum(sd: _Side, lung: str) -> tuple[float, float]:
    sign = -1.0 if lung == RIGHT_LUNG else 1.0
    return sd.apex_y + 0.42 * (sd.cp_y - sd.apex_y), 0.5 + sign * (sd.med_top + 0.02)


def _vessels(rng, sides, n: int) -> np.ndarray:
    """Branching pulmonary vessel markings radiating from each hilum."""
    img = np.zeros((n, n), np.float32)
    for lung, sd in sides.items():
        hy, hx = _hilum(sd, lung)
        out = 0.0 if lung == LEFT_LUNG else np.pi
        roots = []
        for _ in range(12):  # roots spread over the hilum so no single bright hub forms
            a = out + rng.uniform(-1.3, 1.3)
            r = rng.uniform(0.0, 0.03)
            roots.append((hy + rng.normal(0, 0.03) + r * np.sin(a), hx + r * np.cos(a), a))
        _branches(rng, img, roots, 0.045, 5)
    return ndimage.gaussian_filter(img, max(0.8, n / 400))


def _render(rng, size, sides, heart_geo, lesion_terms, effusions, view) -> np.ndarray:
    """The picture: a density map at half resolution (values ~ display grey), then exposure."""
    mid = max(64, size // 2)
    y, x = _grid(mid)
    heart_m = _heart_mask(heart_geo, sides, y, x)
    lung_m = _lung_masks(sides, heart_m, y, x)
    lung_any = (lung_m[RIGHT_LUNG] | lung_m[LEFT_LUNG]).astype(np.float32)
    ax = np.abs(x - 0.5)
    dome = _dome_row(sides, x)
    apex = min(sd.apex_y for sd in sides.values())

    # body: neck, sloping shoulders, chest wall thicker at the flanks (tangential soft tissue)
    shoulder = apex + rng.uniform(-0.06, -0.03)
    half_body = 0.12 + (0.44 + rng.uniform(-0.02, 0.03) - 0.12) * _smoothstep((y - shoulder + 0.1) / 0.16)
    body = _smoothstep((half_body - ax) / 0.015)
    den = 0.5 * body + 0.12 * _smoothstep((ax - 0.3) / 0.14) * body
    arm = _smoothstep((ax - half_body + 0.05) / 0.04) * body
    den += 0.06 * arm

    # mediastinum and heart share a density; spine faint behind them, clearer below
    med = np.zeros((mid, mid), np.float32)
    for lung, sd in sides.items():
        d = _side_d(x, lung)
        border = np.where(y < sd.apex_y, sd.med_top, sd.medial(y))
        med = np.maximum(med, ((d < border) & (d > -0.002) & (y < dome)).astype(np.float32))
    med = np.maximum(med, heart_m.astype(np.float32))
    med = ndimage.gaussian_filter(med, max(1.0, mid / 200))
    den += 0.2 * med * (0.85 + 0.15 * _smoothstep((y - 0.35) / 0.3))
    vert = 0.5 + 0.5 * np.cos(2 * np.pi * (y - 0.1) / rng.uniform(0.05, 0.058))
    spine = _smoothstep((0.038 - ax) / 0.012) * body
    den += spine * (0.04 + 0.03 * vert) * (1 - 0.4 * med)
    trachea = _smoothstep((0.014 - np.abs(x - 0.5)) / 0.006) * _smoothstep((apex + 0.2 - y) / 0.04)
    den -= 0.12 * trachea

    # abdomen below the domes
    below = _smoothstep((y - dome) / 0.008) * body
    den += 0.16 * below * (1 - med)
    if rng.random() < 0.6:  # gastric bubble under the left dome
        sd = sides[LEFT_LUNG]
        gy, gx = sd.cp_y - sd.dome_h + 0.055, 0.5 + sd.dome_peak + 0.02
        den -= 0.14 * _smoothstep((0.04 - np.hypot((x - gx) / 1.5, y - gy)) / 0.012) * below

    if rng.random() < 0.5:  # breast shadows: soft density over the lower lungs, curved lower edge
        for lung, sd in sides.items():
            by, bd = sd.cp_y - rng.uniform(0.1, 0.16), sd.lat_d * rng.uniform(0.55, 0.75)
            r = np.hypot((_side_d(x, lung) - bd) / rng.uniform(0.16, 0.2), (y - by) / rng.uniform(0.12, 0.15))
            den += rng.uniform(0.03, 0.06) * _smoothstep((1 - r) / 0.25) * _smoothstep((1 - r) / 0.04) * body

    # lungs: air, less at the apices (soft tissue overlap) and medially; vessel markings
    lung_soft = ndimage.gaussian_filter(lung_any, max(1.0, mid / 200))
    apex_fade = 1 - 0.3 * _smoothstep((apex + 0.07 - y) / 0.08)
    base_fade = 1 - 0.2 * _smoothstep((y - 0.55) / 0.25)  # chest-wall soft tissue over the bases
    air = 0.34 * lung_soft * apex_fade * base_fade * (0.88 + 0.12 * _smoothstep((ax - 0.1) / 0.15))
    air *= 1 + 0.06 * _smooth_noise(rng, mid, mid / 30)  # uneven aeration / overlying soft tissue
    den -= air
    # pleural fluid: replaces the air below its meniscus (hazy top) and hides the lung markings
    fluid = np.zeros((mid, mid), np.float32)
    for boundary_mid, lung in effusions:
        own_side = (x < 0.5) if lung == RIGHT_LUNG else (x >= 0.5)
        fluid = np.maximum(fluid, _smoothstep((y - boundary_mid[None, :] + 0.012) / 0.035) * own_side)
    den += (air + 0.1 * lung_soft) * fluid
    lung_soft = lung_soft * (1 - 0.85 * fluid)
    for lung, sd in sides.items():  # hilar vessels: a bright, lobulated density near the heart
        hy, hx = _hilum(sd, lung)
        hx += 0.02 if lung == LEFT_LUNG else -0.02
        den += 0.07 * np.exp(-(((y - hy) / 0.05) ** 2 + ((x - hx) / 0.025) ** 2) / 2) * lung_soft
    vessels = _vessels(rng, sides, mid)
    den += 0.16 * min(1.0, mid / 512) ** 0.5 * np.clip(vessels, 0, 1.0) * lung_soft  # thinner lines at low res
    den += 0.012 * _smooth_noise(rng, mid, mid / 250) * lung_soft

    # bones: ribs and clavicles show most against air
    den += _rib_layer(rng, sides, y, x) * body * (0.3 + 0.7 * lung_soft)

    # lesions (fields at mid resolution; the masks use the same fields at full resolution)
    for fmid, gain, kind in lesion_terms:
        den += gain * fmid * lung_soft
        if kind in ("pneumonia", "consolidation") and rng.random() < 0.7:
            # air bronchograms: dark branching airways visible only against the opacity
            peak = np.unravel_index(int(np.argmax(fmid)), fmid.shape)
            tubes = np.zeros_like(fmid)
            py, px = (peak[0] + 0.5) / mid, (peak[1] + 0.5) / mid
            _branches(rng, tubes, [(py, px, rng.uniform(0, 2 * np.pi)) for _ in range(3)], 0.02, 3, 0.5)
            tubes = ndimage.gaussian_filter(tubes, max(0.7, mid / 500))
            den -= 0.6 * gain * np.clip(tubes, 0, 1) * np.clip(fmid, 0, 1)

    den = ndimage.gaussian_filter(den, rng.uniform(0.6, 1.0) * max(0.5, mid / 512))
    full = _resize(den, size)
    # exposure: window to the body, a view-dependent gamma, quantum noise (worse on AP)
    step = max(1, size // 128)
    lo, hi = np.percentile(full[::step, ::step], [0.5, 99.95])
    img = np.clip((full - lo) / (hi - lo + 1e-6), 0, 1) ** rng.uniform(0.95, 1.3)
    sigma = rng.uniform(0.008, 0.016) * (1.5 if view == "AP" else 1.0)
    img = img + sigma * np.sqrt(img + 0.05) * rng.standard_normal(img.shape, dtype=np.float32)
    return np.clip(img, 0, 1).astype(np.float32)


# --- public API -----------------------------------------------------------------------------


def generate_phantom(
    seed: int, size: int = 1024, findings=None, view: str | None = None, healthy: bool = False
) -> Phantom:
    """Draw one synthetic chest radiograph with its ground truth.

    Args:
        seed: any non-negative integer; equal seeds give identical phantoms (bit for bit).
        size: side in pixels of the square image (>= 128).
        findings: findings to draw (strings of :data:`FINDINGS`, any order, repeats ignored);
            ``()`` for a normal chest; ``None`` draws them at random (20 % normal, else 1-3).
        view: ``"PA"`` or ``"AP"``; ``None`` draws it (AP one time in three).
        healthy: render the same chest (anatomy, exposure, noise) without its lesions, the
            ideal healthy counterfactual; masks and ``lesions`` are those of the diseased chest.

    Returns:
        The :class:`Phantom`.

    Raises:
        PhantomError: unknown finding or view, or a size outside ``PHANTOM_MIN_SIZE..PHANTOM_MAX_SIZE``.
    """
    if not PHANTOM_MIN_SIZE <= size <= PHANTOM_MAX_SIZE:
        raise PhantomError(f"size must be {PHANTOM_MIN_SIZE}..{PHANTOM_MAX_SIZE} pixels, got {size}")
    if view is not None and view not in VIEWS:
        raise PhantomError(f"view must be one of {VIEWS}, got {view!r}")
    if findings is not None:
        findings = (findings,) if isinstance(findings, str) else tuple(findings)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x58F10]))
    planned, flags = _plan(rng, findings)
    view = view or ("AP" if rng.random() < 1 / 3 else "PA")
    sides = _sides(rng, planned, view)
    heart_geo = _heart_geometry(rng, sides, flags["cardiomegaly"], view)

    y, x = _grid(size)
    heart = _heart_mask(heart_geo, sides, y, x)
    lungs = _lung_masks(sides, heart, y, x)
    zones = zone_masks(lungs)

    lo = max(64, size // 4)
    mid = max(64, size // 2)
    _, xm = _grid(mid)
    lesions: list[Lesion] = []
    terms, effusions = [], []
    min_area = 0.0006 * size * size
    fluid = np.zeros((size, size), bool)  # pleural fluid hides what lies behind it: drawn first
    for finding, lung in sorted(planned, key=lambda p: p[0] != "effusion"):
        confident = bool(rng.random() < 0.7)
        if finding == "cardiomegaly":
            lesions.append(Lesion(finding, heart.copy(), (), None, confident))
            continue
        if finding == "effusion":
            mask, boundary = _effusion(rng, lung, sides[lung], lungs, y, x)
            fluid |= mask
            lesions.append(Lesion(finding, mask, _zones_of(mask, zones, lung), lung, confident))
            effusions.append((boundary(xm)[0], lung))
            continue
        best = None
        for _ in range(16):  # a lesion drawn off its lung (or behind fluid) is redrawn
            f, thr, gain = _lesion_field(rng, finding, lung, sides, zones, lo)
            mask = (_resize(f, size) > thr) & lungs[lung] & ~fluid
            if best is None or mask.sum() > best[0].sum():
                best = (mask, f, thr, gain)
            if mask.sum() >= min_area:
                break
        assert best is not None  # the loop ran at least once
        mask, f, thr, gain = best
        if not mask.any():  # no room left in this lung (e.g. filled with fluid): no lesion
            continue
        fm = _resize(f, mid)
        terms.append((np.clip((fm - thr * 0.6) / (1 - thr * 0.6), 0, None), gain, finding))
        lesions.append(Lesion(finding, mask, _zones_of(mask, zones, lung), lung, confident))

    if healthy:  # zero gain keeps every random draw of the renderer, so only the lesions go
        terms, effusions = [(f, 0.0, kind) for f, _, kind in terms], []
    image = _render(rng, size, sides, heart_geo, terms, effusions, view)
    return Phantom(
        seed=int(seed),
        image=image,
        lungs=lungs,
        zones=zones,
        heart=heart,
        lesions=lesions,
        view=view,
        ctr=cardiothoracic_ratio(lungs, heart),
        pixel_spacing_mm=400.0 / size,
    )
