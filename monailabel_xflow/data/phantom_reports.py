"""Radiology-style reports written from a phantom's ground truth, with the tuples they state.

:func:`phantom_report` words what a :class:`~monailabel_xflow.data.phantom.Phantom` shows the way a
radiologist would: findings with locations in radiology words ("bibasilar", "retrocardiac",
"right lower lobe", "left mid and lower lung zones"), tentative phrasing for lesions the
phantom marks not confident ("likely atelectasis", "concerning for pneumonia"), negated absent
findings ("No pleural effusion or pneumothorax."), "stable" / "no change in" for present ones,
"has resolved" for a finding that is gone, and distractors: devices (to be ignored) and findings
outside the seven (spine, pneumothorax). Alongside the text it returns the
:class:`~monailabel_xflow.data.mimic_ils.ReportedFinding` tuples a perfect reader extracts from the
chosen section, so structuring can be scored (:mod:`~monailabel_xflow.ils.report_eval`).

The words are true to the pixels: zone words name exactly the zones the finding occupies; a
lobe word is used only where it covers them (base only -> lower lobe; apical / upper only ->
upper lobe); "retrocardiac" only for a left base lesion; a whole lung when all four zones hold
the finding. The truth's locations are what the words map to, e.g. "right lower lobe" (not the
zone it was chosen from).

Layout: 80 % "EXAMINATION / INDICATION / COMPARISON / FINDINGS / IMPRESSION"; 10 % no findings
header (the impression holds the sentences); 10 % no headers at all (the last paragraph does).
Text is drawn from its own random stream, so adding reports changes no image or mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from monailabel_xflow.data.mimic_ils import ReportedFinding
from monailabel_xflow.vocabulary import LUNGS, ZONES

PARTS = ("apical", "upper", "mid", "lower")


@dataclass(frozen=True)
class PhantomReport:
    """A phantom's report and its truth.

    Attributes:
        text: the whole report.
        section_name: ``findings`` / ``impression`` / ``last_paragraph`` (what
            :func:`~monailabel_xflow.ils.report.choose_section` must pick).
        section_text: the chosen section's text.
        sentences: its sentences (1-based indices in ``truth``).
        truth: the tuples the section states.
    """

    text: str
    section_name: str
    section_text: str
    sentences: tuple[str, ...]
    truth: tuple[ReportedFinding, ...]

    def sentence_of(self, finding: str) -> int | None:
        """1-based sentence of the first present tuple of ``finding``, or None."""
        return next((t.sentence for t in self.truth if t.finding == finding and t.present), None)


@dataclass
class _Sentence:
    text: str
    truth: list  # dicts: entity, present, tentative, locations, finding


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


# --- location words ----------------------------------------------------------------------


def _side_words(rng, side: str, zones: list[int], finding: str, lobes_ok: bool) -> tuple[str, tuple[str, ...]]:
    """Words (used before the finding noun) for one lung's occupied zone indices, and labels."""
    z = sorted(zones)
    lung = f"{side} lung"
    if z == [0, 1, 2, 3]:
        return f"{side} lung", (lung,)
    options: list[tuple[str, tuple[str, ...]]] = []
    if z == [3]:
        options += [
            (f"{side} basilar", (ZONES[lung][3],)),
            (f"{side} base", (ZONES[lung][3],)),
            (f"{side} lower lung", (ZONES[lung][3],)),
            (f"{side} lung base", (ZONES[lung][3],)),
        ]
        if lobes_ok:
            options.append((f"{side} lower lobe", (f"{side} lower lobe",)))
        if side == "left" and finding in ("opacity", "atelectasis", "pneumonia", "consolidation"):
            options.append(("retrocardiac", ("left lung base",)))
    elif z == [0]:
        options += [(f"{side} apical", (ZONES[lung][0],))]
    elif z in ([1], [0, 1]) and lobes_ok:
        options += [(f"{side} upper lobe", (f"{side} upper lobe",))]
    if not options or rng.random() < 0.3:
        parts = [PARTS[k] for k in z]
        words = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        noun = "lung zone" if len(parts) == 1 else "lung zones"
        options.append((f"{side} {words} {noun}", tuple(ZONES[lung][k] for k in z)))
    return _pick(rng, options)


def _location_words(rng, phantom, finding: str, lobes_ok: bool = True) -> tuple[str, tuple[str, ...]]:
    """Words naming where ``finding`` is (pre-noun form) and the labels they map to."""
    per = {}
    occupied = set(phantom.occupied_zones(finding))
    for lung in LUNGS:
        zs = [k for k, z in enumerate(ZONES[lung]) if z in occupied]
        if zs:
            per[lung.split()[0]] = zs
    if set(per) == {"right", "left"} and per["right"] == per["left"] == [3]:
        return _pick(
            rng,
            [
                ("bibasilar", ("right lung base", "left lung base")),
                ("bilateral basilar", ("right lung base", "left lung base")),
            ],
        )
    if set(per) == {"right", "left"} and per["right"] == per["left"] == [0, 1, 2, 3]:
        return "bilateral", ("right lung", "left lung")
    parts = [_side_words(rng, side, zs, finding, lobes_ok) for side, zs in per.items()]
    return " and ".join(p[0] for p in parts), tuple(lab for p in parts for lab in p[1])


# --- sentences per finding -----------------------------------------------------------------


def _t(entity, locations=(), finding=None, present=True, tentative=False) -> dict:
    return {
        "entity": entity,
        "present": present,
        "tentative": tentative,
        "locations": tuple(locations),
        "finding": finding,
    }


def _present_sentence(rng, phantom, finding: str, confident: bool) -> _Sentence:
    size = _pick(rng, ["small", "moderate", "small to moderate", "large", "trace"])
    stable = _pick(rng, ["", "", "", "stable ", "unchanged "])
    if finding == "cardiomegaly":
        if not confident:
            return _Sentence("Possible mild cardiomegaly.", [_t("cardiomegaly", (), finding, tentative=True)])
        k = int(rng.integers(4))
        if k == 0:
            return _Sentence(
                _pick(
                    rng,
                    [
                        "The heart is mildly enlarged.",
                        "The heart is moderately enlarged.",
                        "Heart size is moderately enlarged.",
                    ],
                ),
                [_t("enlarged", ("heart",), finding)],
            )
        if k == 1:
            return _Sentence("Cardiomegaly is unchanged.", [_t("Cardiomegaly", (), finding)])
        if k == 2:
            return _Sentence("No change in moderate cardiomegaly.", [_t("cardiomegaly", (), finding)])
        return _Sentence(
            _cap(f"{stable}{_pick(rng, ['mild', 'moderate', 'severe'])} cardiomegaly."),
            [_t("cardiomegaly", (), finding)],
        )
    if finding == "effusion":
        sides = [
            lung.split()[0]
            for lung in LUNGS
            if any(les.finding == finding and les.lung == lung for les in phantom.lesions)
        ]
        locs: tuple[str, ...]
        if len(sides) == 2:
            where, locs, noun, verb = "bilateral", ("right lung", "left lung"), "pleural effusions", "are"
        else:
            where, locs, noun, verb = sides[0], (f"{sides[0]} lung",), "pleural effusion", "is"
        if not confident:
            s = _pick(rng, [f"Possible {size} {where} {noun}.", _cap(f"{size} {where} {noun} {verb} not excluded.")])
            return _Sentence(s, [_t(noun, locs, finding, tentative=True)])
        k = int(rng.integers(3))
        if k == 0:
            return _Sentence(_cap(f"{stable}{size} {where} {noun}."), [_t(noun, locs, finding)])
        if k == 1:
            return _Sentence(f"No change in the {size} {where} {noun}.", [_t(noun, locs, finding)])
        return _Sentence(
            f"There {'are' if verb == 'are' else 'is a'} {size} {where} {noun}.", [_t(noun, locs, finding)]
        )
    if finding == "edema":
        if not confident:
            s = _pick(rng, ["Possible mild pulmonary edema.", "Mild interstitial edema cannot be excluded."])
            ent = "pulmonary edema" if "pulmonary" in s else "interstitial edema"
            return _Sentence(s, [_t(ent, (), finding, tentative=True)])
        k = int(rng.integers(3))
        if k == 0:
            sev = _pick(rng, ["Mild", "Moderate", "Stable mild", "Moderate, unchanged"])
            if sev.endswith("unchanged"):
                return _Sentence("Pulmonary edema is moderate, unchanged.", [_t("Pulmonary edema", (), finding)])
            return _Sentence(f"{sev} pulmonary edema.", [_t("pulmonary edema", (), finding)])
        if k == 1:
            return _Sentence(
                "There is mild bilateral interstitial edema.",
                [_t("interstitial edema", ("right lung", "left lung"), finding)],
            )
        return _Sentence(
            "Pulmonary vascular congestion with mild interstitial edema.",
            [_t("congestion", ("vessels",), None), _t("interstitial edema", (), finding)],
        )
    # focal lung findings
    where, locs = _location_words(rng, phantom, finding)
    Where = _cap(where)
    if finding == "atelectasis":
        if not confident:
            s = _pick(
                rng,
                [
                    f"{Where} opacity, likely atelectasis.",
                    f"{Where} opacities may reflect atelectasis.",
                    f"Possible {where} atelectasis.",
                ],
            )
            ent = "atelectasis" if s.startswith("Possible") else ("opacities" if "opacities" in s else "opacity")
            return _Sentence(s, [_t(ent, locs, finding, tentative=True)])
        s = _pick(
            rng,
            [
                f"{Where} atelectasis.",
                f"{_cap(stable)}{where} atelectasis." if stable else f"Plate-like {where} atelectasis.",
                f"{Where} opacity consistent with atelectasis.",
            ],
        )
        ent = "opacity" if "opacity" in s else "atelectasis"
        return _Sentence(s, [_t(ent, locs, finding)])
    if finding == "pneumonia":
        if not confident:
            s = _pick(
                rng,
                [
                    f"{Where} consolidation concerning for pneumonia.",
                    f"{Where} opacity may represent pneumonia.",
                    f"Possible {where} pneumonia.",
                ],
            )
            ent = "consolidation" if "consolidation" in s else ("opacity" if "opacity" in s else "pneumonia")
            return _Sentence(s, [_t(ent, locs, finding, tentative=True)])
        s = _pick(
            rng,
            [
                f"{Where} pneumonia.",
                f"Focal {where} consolidation consistent with pneumonia.",
                f"{Where} opacity compatible with pneumonia.",
            ],
        )
        ent = "consolidation" if "consolidation" in s else ("opacity" if "opacity" in s else "pneumonia")
        return _Sentence(s, [_t(ent, locs, finding)])
    if finding == "consolidation":
        if not confident:
            return _Sentence(f"Possible {where} consolidation.", [_t("consolidation", locs, finding, tentative=True)])
        s = _pick(
            rng,
            [
                f"{Where} consolidation.",
                f"Dense {where} consolidation.",
                f"{_cap(stable)}{where} consolidation." if stable else f"New {where} consolidation.",
            ],
        )
        return _Sentence(s, [_t("consolidation", locs, finding)])
    # opacity
    if not confident:
        return _Sentence(
            _pick(rng, [f"Questionable {where} opacity.", f"Possible faint {where} opacity."]),
            [_t("opacity", locs, finding, tentative=True)],
        )
    s = _pick(rng, [f"Patchy {where} opacity.", f"Ill-defined {where} opacity.", f"Hazy {where} opacities."])
    return _Sentence(s, [_t("opacities" if "opacities" in s else "opacity", locs, finding)])


_NEG_WORDS = {
    "effusion": ("pleural effusion", "effusion"),
    "consolidation": ("focal consolidation", "consolidation"),
    "pneumonia": ("pneumonia", "pneumonia"),
    "edema": ("pulmonary edema", "pulmonary edema"),
    "atelectasis": ("atelectasis", "atelectasis"),
    "opacity": ("focal opacity", "opacity"),
}
"""Negated mention words -> (as written, entity extracted)."""


def _negations(rng, absent: list[str]) -> list[_Sentence]:
    """ "No X or Y." sentences for some absent findings plus pneumothorax."""
    out = []
    pool = [f for f in absent if f in _NEG_WORDS]
    rng.shuffle(pool)
    chosen = pool[: int(rng.integers(1, 4))] if pool else []
    names = [("pneumothorax", "pneumothorax", None)] + [(_NEG_WORDS[f][0], _NEG_WORDS[f][1], f) for f in chosen]
    rng.shuffle(names)
    while names:
        k = min(len(names), int(rng.integers(1, 4)))
        group, names = names[:k], names[k:]
        words = [g[0] for g in group]
        listed = words[0] if k == 1 else (" or ".join(words) if k == 2 else ", ".join(words[:-1]) + ", or " + words[-1])
        lead = _pick(rng, ["No", "There is no", "No evidence of"])
        truth = []
        for written, entity, finding in group:
            ent = entity if written.endswith(entity) else written
            ent = written.split()[-1] if written in ("focal consolidation", "focal opacity") else ent
            truth.append(_t(ent, (), finding, present=False))
        out.append(_Sentence(f"{lead} {listed}.", truth))
    if "cardiomegaly" in absent:
        out.append(
            _Sentence(
                _pick(
                    rng,
                    [
                        "Heart size is normal.",
                        "The cardiomediastinal silhouette is normal.",
                        "Heart size is within normal limits.",
                    ],
                ),
                [],
            )
        )
    return out


def _resolved(rng, finding: str) -> _Sentence:
    side = _pick(rng, ["right", "left"])
    if finding == "effusion":
        return _Sentence(
            f"The previously seen {side} pleural effusion has resolved.",
            [_t("pleural effusion", (f"{side} lung",), finding, present=False)],
        )
    lobe = _pick(rng, [f"{side} lower lobe", f"{side} upper lobe"])
    word = {
        "pneumonia": "pneumonia",
        "consolidation": "consolidation",
        "atelectasis": "atelectasis",
        "opacity": "opacity",
        "edema": "pulmonary edema",
    }[finding]
    if finding == "edema":
        return _Sentence("Previously seen pulmonary edema has resolved.", [_t(word, (), finding, present=False)])
    return _Sentence(f"Interval resolution of the {lobe} {word}.", [_t(word, (lobe,), finding, present=False)])


_DEVICES = (
    "Endotracheal tube terminates 4 cm above the carina.",
    "Right internal jugular central venous catheter tip is in the mid SVC.",
    "Left-sided pacemaker with leads in the right atrium and right ventricle.",
    "Enteric tube courses below the diaphragm with its tip in the stomach.",
    "Right PICC line ends at the cavoatrial junction.",
    "Median sternotomy wires are intact.",
)


def phantom_report(phantom, rng: np.random.Generator) -> PhantomReport:
    """Write a report for ``phantom`` (rules in the module docstring).

    Args:
        phantom: the :class:`~monailabel_xflow.data.phantom.Phantom`.
        rng: the report's own random stream.

    Returns:
        The :class:`PhantomReport` (text, chosen section, truth tuples).
    """
    from monailabel_xflow.vocabulary import FINDINGS

    present = list(phantom.findings)
    absent = [f for f in FINDINGS if f not in present]
    confident = {f: all(les.confident for les in phantom.lesions if les.finding == f) for f in present}
    body: list[_Sentence] = []
    if rng.random() < 0.35:
        body.append(_Sentence(_pick(rng, _DEVICES), []))
    lung_first = [f for f in present if f != "cardiomegaly"]
    for f in lung_first:
        body.append(_present_sentence(rng, phantom, f, confident[f]))
    resolvable = [f for f in absent if f not in ("cardiomegaly",)]
    if resolvable and rng.random() < 0.3:
        gone = _pick(rng, resolvable)
        body.append(_resolved(rng, gone))
        absent = [f for f in absent if f != gone]
    if "cardiomegaly" in present:
        body.append(_present_sentence(rng, phantom, "cardiomegaly", confident["cardiomegaly"]))
    if not present:
        body.append(_Sentence(_pick(rng, ["The lungs are clear.", "Lungs are well expanded and clear."]), []))
    body += _negations(rng, absent)
    if rng.random() < 0.25:
        body.append(
            _Sentence(
                _pick(
                    rng,
                    [
                        "Mild degenerative changes of the thoracic spine.",
                        "Degenerative changes are seen in the thoracic spine.",
                    ],
                ),
                [_t("degenerative changes", ("thoracic spine",), None)],
            )
        )
    sentences = tuple(s.text for s in body)
    truth = tuple(
        ReportedFinding(t["entity"], i + 1, t["present"], t["tentative"], t["locations"], t["finding"])
        for i, s in enumerate(body)
        for t in s.truth
    )
    section_text = " ".join(sentences)

    view = "PORTABLE AP" if phantom.view == "AP" else "PA AND LAT"
    indication = _pick(
        rng,
        [
            "___-year-old with shortness of breath.",
            "Cough and fever, evaluate for pneumonia.",
            "Chest pain.",
            "Post-procedure check.",
        ],
    )
    comparison = _pick(rng, ["None.", "Chest radiograph from ___."])
    summary = (
        "No acute cardiopulmonary process."
        if not present
        else " ".join(f"{k + 1}. {_cap(f)}." for k, f in enumerate(present))
    )
    layout = rng.random()
    if layout < 0.8:
        name = "findings"
        text = (
            f"EXAMINATION:  CHEST ({view})\n\nINDICATION:  {indication}\n\nCOMPARISON:  {comparison}\n\n"
            f"FINDINGS: \n\n{section_text}\n\nIMPRESSION: \n\n{summary}\n"
        )
    elif layout < 0.9:
        name = "impression"
        text = f"EXAMINATION:  CHEST ({view})\n\nINDICATION:  {indication}\n\nIMPRESSION: \n\n{section_text}\n"
    else:
        name = "last_paragraph"
        text = f"CHEST ({view}) {comparison}\n\n{section_text}\n"
    return PhantomReport(text, name, section_text, sentences, truth)
