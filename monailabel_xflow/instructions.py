"""Instructions: what a user asks for, in MIMIC-ILS canonical form.

An :class:`Instruction` is a finding plus the regions it is asked about. It renders the
canonical instruction and answer sentences, which are scored by exact match, so they are only
ever produced here. :func:`parse_instructions` maps free text ("is there fluid on the left?",
"pleural effusion, left base", "segment all findings") to instructions, and refuses what it
cannot map with an :class:`InstructionError` that lists what is supported: never a silent guess.

Free-text choices (where the dataset is silent):

* "both lungs" / "bilateral" keep both lungs as regions (lung level, two regions).
* A zone named without a side ("upper zones", "the bases") means both sides.
* Several findings in one sentence each keep their own location: the text is cut into clauses
  at ``,`` ``;`` ``:`` and the words "and", "or", "plus", "but"; a clause that names a finding
  starts a group, and the clauses after it that name only a location belong to that group
  ("effusion in the left mid and lower zones"); location words before the first finding belong
  to the first group ("in the left lung, edema and effusion"). "left effusion, right edema"
  gives effusion in the left lung and edema in the right lung. A finding whose group names no
  location shares the next group's location ("edema and effusion in the left lung"), else the
  previous one's; cardiomegaly never borrows (it is asked at chest level). The same finding
  named twice is asked once, over both locations.
* A finding XFlow does not segment (pneumothorax, nodule, ...) anywhere in the text refuses the
  whole request, naming it and listing what is supported: "effusion or pneumothorax?" is not
  answered about effusion alone.
* Negations and questions stay questions: "no effusion on the left?", "is there edema?" and
  "rule out effusion" ask the same as "Segment the effusion ..."; the answer says present or
  absent.
* "all findings" without a location gives the seven findings at chest level; with a lung
  location, the six lung findings (cardiomegaly is asked at chest level only); "in the heart",
  cardiomegaly alone.

Locations are never dropped or swapped silently; these are refused with the reason:

* a finding other than cardiomegaly asked at the heart ("effusion in the heart", "around the
  heart", "in the cardiac region"): the heart is cardiomegaly's region only;
* a location phrase the parser does not know ("in the liver", "of the spine"): a preposition
  and an article or possessive ("in the", "of this", "in his") followed by none of the words it
  understands. Words that carry no location ("in the image", "on this film", "in the chest",
  "in the lungs") ask at chest level, as before;
* a negated location ("not on the left", "except the right lung", "other than the left"): the
  parser has no "everything but" region, so segmenting the named side would answer the
  opposite question. Negated findings ("no effusion on the left?") stay questions, as above.

A finding excluded from a set of findings is refused likewise ("all findings except effusion",
"segment all findings but the effusion", "effusion, not pneumonia"): word by word each asks
about the finding the user left out. "except", "other than", "rather than" (and "but" after "all
findings") always exclude; "not" and "without" only where the text names more than one finding,
so "not effusion?" alone stays a question.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from monailabel_xflow.errors import InputError
from monailabel_xflow.vocabulary import (
    ALL_ZONES,
    FINDINGS,
    HEART,
    KINDS,
    LESION_INFERENCE_TARGETS,
    LUNGS,
    REGIONS,
    ZONES,
    join_regions,
    lung_of,
)

MAX_INSTRUCTION_CHARS = 300
"""Longest free-text instruction accepted (the canonical ones are under 80 characters)."""


class InstructionError(InputError):
    """Free text that cannot be mapped to a supported instruction; the message says why."""


@dataclass(frozen=True)
class Instruction:
    """One question about one finding.

    Attributes:
        finding: one of :data:`~monailabel_xflow.vocabulary.FINDINGS`; ``"opacity"`` for lesion
            inference (the answer names the lesion type).
        regions: lung and/or zone strings in the order asked, ``()`` for a chest-level
            question, or ``("heart",)`` for cardiomegaly.
        kind: ``"basic"`` (finding in a location), ``"global"`` (finding alone; the answer
            names the location) or ``"lesion_inference"``.
    """

    finding: str
    regions: tuple[str, ...] = ()
    kind: str = "basic"

    def __post_init__(self) -> None:
        regions = tuple(dict.fromkeys(self.regions))  # drop repeats, keep the asked order
        object.__setattr__(self, "regions", regions)
        if self.finding not in FINDINGS:
            raise InstructionError(f"unknown finding {self.finding!r}; supported: {', '.join(FINDINGS)}")
        if self.kind not in KINDS:
            raise InstructionError(f"unknown instruction kind {self.kind!r}; supported: {', '.join(KINDS)}")
        unknown = [r for r in regions if r not in REGIONS]
        if unknown:
            raise InstructionError(f"unknown region(s) {unknown}; supported: {', '.join(REGIONS)}")
        if self.finding == "cardiomegaly":
            if regions not in ((), (HEART,)):
                raise InstructionError("cardiomegaly is asked at chest level only (region 'heart' or none)")
        elif HEART in regions:
            raise InstructionError(f"'heart' is the region of cardiomegaly only, not of {self.finding}")
        if self.kind == "global" and regions:
            raise InstructionError("a global instruction names no location")
        if self.kind == "basic" and not regions:
            raise InstructionError("a basic instruction names a location; use kind='global' for none")
        if self.kind == "lesion_inference" and self.finding != "opacity":
            raise InstructionError("lesion inference asks about an opacity and predicts its type")

    # --- what it asks ---------------------------------------------------------------------

    @property
    def level(self) -> str:
        """Question level of the XFlow evaluation: ``chest``, ``lung`` or ``zone``."""
        if any(r in ALL_ZONES for r in self.regions):
            return "zone"
        if any(r in LUNGS for r in self.regions):
            return "lung"
        return "chest"

    @property
    def location(self) -> str:
        """The regions joined the MIMIC-ILS way, "" at chest level without a region."""
        return join_regions(self.regions)

    @property
    def lungs(self) -> tuple[str, ...]:
        """The lungs Stage 1 grounds: the asked side(s), or both for a chest-level question."""
        asked = {lung_of(r) for r in self.regions if r != HEART}
        return tuple(lung for lung in LUNGS if lung in asked) or LUNGS

    @property
    def text(self) -> str:
        """The canonical MIMIC-ILS instruction."""
        where = f" in the {self.location}" if self.regions else ""
        if self.kind == "lesion_inference":
            return f"Segment the opacity{where} and predict its type."
        return f"Segment the {self.finding}{where}."

    # --- canonical answers ----------------------------------------------------------------

    def absent_answer(self) -> str:
        """The negative answer: ``There is no effusion in the left lung.``"""
        where = f" in the {self.location}" if self.regions else ""
        return f"There is no {self.finding}{where}."

    @staticmethod
    def located_answer(regions: tuple[str, ...] | list[str]) -> str:
        """Positive answer of a global instruction: ``It is located in the left lung base.``"""
        if not regions:
            raise InstructionError("a located answer needs at least one region")
        return f"It is located in the {join_regions(tuple(regions))}."

    @staticmethod
    def lesion_answer(lesion: str, confident: bool) -> str:
        """Positive answer of lesion inference: highly suggestive of / possibly reflects."""
        if lesion not in LESION_INFERENCE_TARGETS:
            raise InstructionError(
                f"lesion inference resolves to {', '.join(LESION_INFERENCE_TARGETS)}, not {lesion!r}"
            )
        return f"It is highly suggestive of {lesion}." if confident else f"It possibly reflects {lesion}."

    def message(self, answer: str, regions: int, pixels: int) -> str:
        """The sentence for people (XFlow's and ROSALIA's alike): the canonical ``answer``, or
        for a present answer given by the mask alone (``""``) a summary:
        ``Segmented the effusion in the left lung (2 regions, 5120 px).``

        Args:
            answer: the canonical answer ("" for a present basic instruction).
            regions: how many lesion regions the mask was made of.
            pixels: the mask's foreground pixels.
        """
        if answer:
            return answer
        where = f" in the {self.location}" if self.regions else ""
        return f"Segmented the {self.finding}{where} ({regions} region{'s' if regions != 1 else ''}, {pixels} px)."

    def to_dict(self) -> dict[str, Any]:
        return {
            "instruction": self.text,
            "finding": self.finding,
            "regions": list(self.regions),
            "level": self.level,
            "kind": self.kind,
        }


# --- free-text parsing ----------------------------------------------------------------------

_FINDING_SYNONYMS: dict[str, tuple[str, ...]] = {
    "cardiomegaly": (
        "cardiomegaly",
        "enlarged heart",
        "heart enlargement",
        "enlarged cardiac silhouette",
        "cardiac enlargement",
        "big heart",
        "large heart",
        "heart is enlarged",
        "heart enlarged",
    ),
    "pneumonia": ("pneumonia", "pneumonias", "pneumonic"),
    "atelectasis": ("atelectasis", "atelectatic", "atelectases", "collapse", "collapsed lung"),
    "opacity": ("opacity", "opacities", "opacification", "airspace opacity", "airspace disease", "haziness"),
    "consolidation": ("consolidation", "consolidations", "consolidated"),
    "edema": ("edema", "oedema", "pulmonary edema", "pulmonary oedema", "fluid overload", "interstitial edema"),
    "effusion": ("effusion", "effusions", "pleural effusion", "pleural effusions", "pleural fluid", "fluid"),
}

# Radiograph findings outside XFlow's seven: anywhere in the text they refuse the request.
_UNSUPPORTED_FINDINGS = (
    "pneumothorax",
    "nodule",
    "mass",
    "fracture",
    "emphysema",
    "fibrosis",
    "hernia",
    "pleural thickening",
    "infiltrate",
    "infiltration",
    "granuloma",
    "cavity",
    "calcification",
)
# Other things people ask about: named in the error only when no supported finding is asked.
_UNSUPPORTED = (*_UNSUPPORTED_FINDINGS, "lesion", "tube", "line", "device")
_CLAUSE_SEP = re.compile(r"[,;:]|\b(?:and|or|plus|but)\b")

_SIDES = {
    "left": ("left",),
    "right": ("right",),
    "both": ("right", "left"),
    "bilateral": ("right", "left"),
    "bilaterally": ("right", "left"),
}
_ZONE_WORDS = {
    "apical": 0,
    "apex": 0,
    "apices": 0,
    "apexes": 0,
    "upper": 1,
    "mid": 2,
    "middle": 2,
    "base": 3,
    "bases": 3,
    "basal": 3,
    "basilar": 3,
    "lower": 3,
}
_ALL = re.compile(
    r"\b(all|every|each|any)\s+(the\s+)?(findings?|abnormalit(y|ies)|patholog(y|ies)|lesions?)\b"
    r"|\beverything\b"
)
_TYPE = re.compile(r"predict (its|the) (type|kind)|what (type|kind)|\bclassify\b|characteri[sz]e|\bits type\b")
_WORD = re.compile(r"[a-z]+")

# --- location phrases ("in the liver", "on this film") ----------------------------------------
# A location is introduced by a preposition and an article or possessive. Bare "in X" is not
# checked: it collides with idioms ("in general", "at all") that no short list covers.
_PREPOSITIONS = frozenset(
    ["in", "on", "at", "of", "within", "inside", "over", "across", "throughout", "near", "around", "involving"]
)
# Not "a" ("in a butterfly pattern" describes) nor "its" ("in terms of its type").
_DETERMINERS = frozenset(["the", "this", "that", "these", "those", "his", "her", "their", "my", "your", "our", "each"])
# Words that name a lung location (with _SIDES and _ZONE_WORDS); "in the lungs" is chest level.
_LUNG_WORDS = frozenset(
    [
        "lung",
        "lungs",
        "zone",
        "zones",
        "side",
        "sides",
        "field",
        "fields",
        "lobe",
        "lobes",
        "hemithorax",
        "hemithoraces",
    ]
)
# Words after "in the ..." that name the picture, the whole chest or the findings: no location.
_NOT_LOCATIONS = frozenset(
    [
        "image",
        "images",
        "radiograph",
        "radiographs",
        "radiography",
        "x",
        "ray",
        "rays",
        "xray",
        "xrays",
        "cxr",
        "film",
        "films",
        "study",
        "studies",
        "picture",
        "pictures",
        "scan",
        "scans",
        "exam",
        "examination",
        "view",
        "views",
        "chest",
        "thorax",
        "patient",
        "case",
        "finding",
        "findings",
        "abnormality",
        "abnormalities",
        "pathology",
        "pathologies",
        "lesion",
        "lesions",
    ]
)
# Relative places the parser cannot resolve ("on the other side"): unknown, never chest level.
_RELATIVE = frozenset(["other", "opposite", "contralateral", "ipsilateral", "same"])
# The heart as a place ("around the heart", "in the cardiac region"): cardiomegaly's region only.
_HEART_WORDS = frozenset(["heart", "cardiac", "pericardium", "pericardial"])
_ARTICLES = frozenset(["a", "an", "any", "all"])  # "except any effusion", "not an edema"
_PHRASE_SEP = re.compile(r"[,;:.?!]|\b(?:and|or|plus|but)\b")
_PHRASE_WORDS = 3  # how far a location phrase reaches ("in the right upper zone")
_NEGATION = re.compile(
    r"\b(?:not|except(?:\s+for)?|excluding|exclude|other\s+than|without|apart\s+from|aside\s+from|besides"
    r"|outside(?:\s+of)?|sparing|rather\s+than|instead\s+of)\b|\b[a-z]+n['’]t\b"
)


def _location_words(word: str) -> bool:
    """Whether ``word`` names (part of) a lung location the parser maps."""
    return word in _SIDES or word in _ZONE_WORDS or word in _LUNG_WORDS


def _location_phrases(text: str) -> list[tuple[str, str]]:
    """Every "preposition + article + words" phrase of ``text``, with what it names.

    Returns:
        ``(phrase, what)`` in text order; ``what`` is ``"finding"`` ("the type of the
        opacity"), ``"lung"`` (a side, zone or lung word), ``"heart"``, ``"none"`` (the image
        or the chest: no location) or ``"unknown"`` ("in the liver").
    """
    out = []
    for piece in _PHRASE_SEP.split(text):
        words = _WORD.findall(piece)
        for i, word in enumerate(words[:-1]):
            if word not in _PREPOSITIONS or words[i + 1] not in _DETERMINERS:
                continue
            j = i + 1
            while j < len(words) and words[j] in _DETERMINERS:
                j += 1
            if "s" in words[j : j + _PHRASE_WORDS]:  # "the patient's liver": the possessor is not the place
                j += words[j:].index("s") + 1
            span: list[str] = []
            for w in words[j:]:
                if w in _PREPOSITIONS or w in _DETERMINERS or len(span) == _PHRASE_WORDS:
                    break
                span.append(w)
            if not span:
                continue
            phrase = " ".join(words[i:j] + span).replace(" s ", "'s ")
            if _find_findings(" ".join(span)):
                what = "finding"
            elif any(w in _RELATIVE for w in span):
                what = "unknown"
            elif span[0] in _HEART_WORDS:
                what = "heart"
            elif any(_location_words(w) for w in span):
                what = "lung"
            elif any(w in _HEART_WORDS for w in span):
                what = "heart"
            elif any(w in _NOT_LOCATIONS for w in span):
                what = "none"
            else:
                what = "unknown"
            out.append((phrase, what))
    return out


def _negated_location(norm: str) -> str | None:
    """The first negated location of ``norm`` ("not on the left", "except the right lung").

    A negation counts when, past at most three prepositions or articles, the next word names a
    location; "not pneumonia", "no effusion on the left" and "or not?" are not negated locations.
    """
    for m in _NEGATION.finditer(norm):
        words = _WORD.findall(_PHRASE_SEP.split(norm[m.end() :])[0])  # "or not? left lung" is not one
        for k, word in enumerate(words[:4]):
            if _location_words(word) or word in _HEART_WORDS:
                end = k + 1
                while end < len(words) and (_location_words(words[end]) or words[end] in _HEART_WORDS):
                    end += 1  # quote the whole place: "excluding the left upper zone"
                return " ".join([m.group(0), *words[:end]])
            if word not in _PREPOSITIONS and word not in _DETERMINERS:
                break
    return None


def _excluded_finding(norm: str, several: bool) -> str | None:
    """The first finding ``norm`` excludes ("all findings except effusion", "effusion, not edema").

    An exclusion word ("except", "other than", "but" after "all findings", ...) before a finding
    always excludes it. "not" and "without" exclude only when the text asks about more than one
    finding (``several``): alone, "not effusion" stays a question about effusion.
    """
    matches = list(_NEGATION.finditer(norm))
    if _ALL.search(norm):
        matches += list(re.finditer(r"\bbut\b", norm))  # "all findings but the effusion"
    for m in sorted(matches, key=lambda m: m.start()):
        if not several and re.fullmatch(r"not|without|[a-z]+n['’]t", m.group(0)):
            continue
        words = _WORD.findall(_PHRASE_SEP.split(norm[m.end() :])[0])
        k = 0
        while k < min(len(words), 4) and words[k] in _PREPOSITIONS | _DETERMINERS | _ARTICLES:
            k += 1
        rest = " ".join(words[k:])
        for phrase in sorted((p for ps in _FINDING_SYNONYMS.values() for p in ps), key=len, reverse=True):
            if re.match(rf"{re.escape(phrase)}\b", rest):
                return " ".join([m.group(0), *words[:k], phrase])
    return None


def _supported_locations() -> str:
    """The locations the parser maps, for error messages."""
    return f"{', '.join(LUNGS)}, both lungs, zones ({', '.join(ALL_ZONES)}), or none (chest level)"


def _find_findings(text: str) -> list[tuple[int, str]]:
    """(position, finding) of every synonym, longest first so "fluid overload" beats "fluid"."""
    phrases = sorted(((p, f) for f, ps in _FINDING_SYNONYMS.items() for p in ps), key=lambda t: -len(t[0]))
    taken = [False] * len(text)
    found = []
    for phrase, finding in phrases:
        for m in re.finditer(rf"\b{re.escape(phrase)}\b", text):
            if not any(taken[m.start() : m.end()]):
                taken[m.start() : m.end()] = [True] * (m.end() - m.start())
                found.append((m.start(), finding))
    return sorted(found)


def _find_regions(words: list[str]) -> list[str]:
    """Lung and zone strings in the order mentioned.

    A zone word takes the side word before it (sticky across "and": "left mid and lower
    zones"), else the first side word after it ("base of the left lung"), else both sides. A
    side word that no zone word takes names the whole lung.
    """
    sides = [(i, _SIDES[w]) for i, w in enumerate(words) if w in _SIDES]
    zones = [(i, _ZONE_WORDS[w]) for i, w in enumerate(words) if w in _ZONE_WORDS]
    used_sides: set[int] = set()
    mentions: list[tuple[int, str]] = []
    for zi, zone_index in zones:
        before = [s for s in sides if s[0] < zi]
        after = [s for s in sides if s[0] > zi and s[0] - zi <= 4]
        if before:
            si, side = before[-1]
        elif after:
            si, side = after[0]
        else:
            si, side = -1, ("right", "left")
        used_sides.add(si)
        for s in side:
            mentions.append((zi, ZONES[f"{s} lung"][zone_index]))
    for si, side in sides:
        if si not in used_sides:
            for s in side:
                mentions.append((si, f"{s} lung"))
    # "heart" as a *region* only when asked "in the heart" ("enlarged heart" names the finding).
    for i in range(2, len(words)):
        if words[i] == "heart" and words[i - 2 : i] == ["in", "the"]:
            mentions.append((i, HEART))
    return list(dict.fromkeys(r for _, r in sorted(mentions, key=lambda m: m[0])))


def supported_summary() -> str:
    """What the parser understands, for error messages and ``--help``."""
    return (
        f"findings: {', '.join(FINDINGS)} (and 'all findings'); "
        f"locations: {_supported_locations()}; "
        "e.g. 'Segment the effusion in the left lung.', 'pleural effusion, left base', "
        "'Segment the opacity in the right upper zone lung and predict its type.'"
    )


def parse_instructions(text: str) -> list[Instruction]:
    """Map free text to one or more canonical instructions.

    Args:
        text: what the user typed, at most :data:`MAX_INSTRUCTION_CHARS` characters.

    Returns:
        One instruction per finding asked about (seven for "all findings").

    Raises:
        InstructionError: empty or over-long text, no supported finding, an unsupported one,
            a location that does not fit the finding (the heart for a lung finding), an unknown
            location phrase or a negated one. The message lists what is supported.
    """
    if not isinstance(text, str):
        raise InstructionError(f"an instruction is text, got {type(text).__name__}")
    if len(text) > MAX_INSTRUCTION_CHARS:
        raise InstructionError(f"instruction is {len(text)} characters; at most {MAX_INSTRUCTION_CHARS} are accepted")
    norm = " ".join(text.lower().replace("-", " ").replace("_", " ").split())
    if not norm.strip(" .?!"):
        raise InstructionError(f"empty instruction; supported {supported_summary()}")
    unsupported = [u for u in _UNSUPPORTED_FINDINGS if re.search(rf"\b{u}(s|es)?\b", norm)]
    if unsupported:
        raise InstructionError(
            f"cannot map {text.strip()!r}: {', '.join(map(repr, unsupported))} "
            f"{'is' if len(unsupported) == 1 else 'are'} not among XFlow's findings; "
            f"supported {supported_summary()}"
        )
    lesion_inference = bool(_TYPE.search(norm))
    groups = _finding_groups(norm)
    findings = list(dict.fromkeys(f for fs, _, _ in groups for f in fs))
    if lesion_inference:
        if findings not in ([], ["opacity"]) and not set(findings) <= set(LESION_INFERENCE_TARGETS) | {"opacity"}:
            raise InstructionError("lesion inference asks about an opacity and predicts its type")
        where = [r for _, rs, _ in groups for r in rs] or _find_regions(_WORD.findall(norm))
        groups = [(["opacity"], where, [h for _, _, hs in groups for h in hs])]
        findings = ["opacity"]
    if not findings:
        named = [u for u in _UNSUPPORTED if re.search(rf"\b{u}s?\b", norm)]
        why = f"{named[0]!r} is not one of XFlow's findings" if named else "no supported finding found"
        raise InstructionError(f"cannot map {text.strip()!r}: {why}; supported {supported_summary()}")
    excluded = _excluded_finding(norm, several=len(findings) > 1)
    if excluded:
        raise InstructionError(
            f"cannot map {text.strip()!r}: excluding a finding ({excluded!r}) is not supported; "
            f"name the findings to segment instead ({', '.join(FINDINGS)})"
        )
    _refuse_unmapped_locations(text, norm)

    asked: dict[str, list[str]] = {}
    for index, (group_findings, own, heart) in enumerate(groups):
        for finding in group_findings:
            if finding != "cardiomegaly" and (heart or HEART in own):
                phrase = heart[0] if heart else "in the heart"
                raise InstructionError(
                    f"'heart' is the region of cardiomegaly only, not of {finding} ({phrase!r}); "
                    f"supported locations: {_supported_locations()}"
                )
            if finding == "cardiomegaly":
                lung_regions = [r for r in own if r != HEART]
                if lung_regions:
                    raise InstructionError(
                        f"cardiomegaly is asked at chest level only, not in the {join_regions(lung_regions)}"
                    )
                these = [HEART] if HEART in own else []
            else:
                these = [r for r in (own or _borrowed(groups, index)) if r != HEART]
            asked.setdefault(finding, []).extend(these)
    out = []
    for finding, these in asked.items():
        regions = tuple(dict.fromkeys(these))
        kind = "lesion_inference" if lesion_inference else ("basic" if regions else "global")
        out.append(Instruction(finding, regions, kind))
    return out


_Group = tuple[list[str], list[str], list[str]]
"""Findings, regions and heart phrases ("around the heart") of one group of clauses."""


def _finding_groups(norm: str) -> list[_Group]:
    """``[(findings, regions, heart phrases)]`` per group of clauses (see the module
    docstring), in text order."""
    groups: list[_Group] = []
    pending: list[str] = []  # location words before the first finding
    pending_heart: list[str] = []
    for clause in _CLAUSE_SEP.split(norm):
        words = _WORD.findall(clause)
        heart = [phrase for phrase, what in _location_phrases(clause) if what == "heart"]
        if _ALL.search(clause):
            found = list(FINDINGS)
        else:
            found = list(dict.fromkeys(f for _, f in _find_findings(clause)))
        if found:
            groups.append((found, pending + words, pending_heart + heart))
            pending, pending_heart = [], []
        elif groups:
            groups[-1][1].extend(words)
            groups[-1][2].extend(heart)
        else:
            pending.extend(words)
            pending_heart.extend(heart)
    out = []
    for found, words, heart in groups:
        regions = _find_regions(words)
        everything = len(found) == len(FINDINGS)
        if regions and any(r != HEART for r in regions):  # "all findings in a lung": not cardiomegaly
            found = [f for f in found if not (f == "cardiomegaly" and everything)]
        elif everything and (heart or HEART in regions):  # "all findings in the heart": cardiomegaly
            found = ["cardiomegaly"]
        out.append((found, regions, heart))
    return out


def _refuse_unmapped_locations(text: str, norm: str) -> None:
    """Refuse a negated location or a location phrase the parser does not know.

    Both would otherwise be dropped or read as their opposite, and the finding segmented over a
    region the user did not ask for.

    Raises:
        InstructionError: naming the phrase and listing the supported locations.
    """
    negated = _negated_location(norm)
    if negated:
        raise InstructionError(
            f"cannot map {text.strip()!r}: negated locations ({negated!r}) are not supported; "
            f"name the region to segment instead ({_supported_locations()})"
        )
    phrases = _location_phrases(norm)
    unknown = [
        phrase
        for k, (phrase, what) in enumerate(phrases)
        # "in the periphery of the left lung": a part of a known place is read as that place
        if what == "unknown"
        and not (k + 1 < len(phrases) and phrases[k + 1][0].startswith("of ") and phrases[k + 1][1] == "lung")
    ]
    if unknown:
        raise InstructionError(
            f"cannot map {text.strip()!r}: {unknown[0]!r} is not a location XFlow knows; "
            f"supported locations: {_supported_locations()}"
        )


def _borrowed(groups: list[_Group], index: int) -> list[str]:
    """The location a group without one shares: the next group's that has one, else the previous."""
    for _, regions, _ in groups[index + 1 :]:
        if regions:
            return regions
    for _, regions, _ in reversed(groups[:index]):
        if regions:
            return regions
    return []


def parse_instruction(text: str) -> Instruction:
    """Like :func:`parse_instructions` for text that must name exactly one finding."""
    found = parse_instructions(text)
    if len(found) != 1:
        raise InstructionError(
            f"{text.strip()!r} asks about {len(found)} findings ({', '.join(i.finding for i in found)}); ask about one"
        )
    return found[0]


ALL_FINDINGS = "all findings"
"""The picker choice that asks for every finding (what a screening pass asks)."""


def from_choices(findings: Sequence[str], locations: Sequence[str] = ()) -> list[Instruction]:
    """Instructions built straight from picker choices (no text round trip).

    Args:
        findings: finding names of :data:`~monailabel_xflow.vocabulary.FINDINGS`, or
            :data:`ALL_FINDINGS`.
        locations: lung and zone names, asked together (none: chest level).

    Returns:
        One :class:`Instruction` per finding, in order, without repeats; :data:`ALL_FINDINGS`
        expands to every finding that can be asked at ``locations``.

    Raises:
        InstructionError: an unknown finding or location, or cardiomegaly at a location.
    """
    regions = tuple(dict.fromkeys(locations))
    kind = "basic" if regions else "global"
    out: list[Instruction] = []
    for finding in findings:
        if finding == ALL_FINDINGS:
            out += [Instruction(f, regions, kind) for f in FINDINGS if not (regions and f == "cardiomegaly")]
        elif finding == "cardiomegaly" and regions:
            raise InstructionError(f"cardiomegaly is asked at chest level only, not in the {join_regions(regions)}")
        else:
            out.append(Instruction(finding, regions, kind))
    return list(dict.fromkeys(out))


def all_findings(regions: tuple[str, ...] = ()) -> list[Instruction]:
    """The "segment all findings" expansion: every finding that can be asked at ``regions``."""
    return parse_instructions("segment all findings" + (f" in the {join_regions(regions)}" if regions else ""))


_BASIC = (
    "{canonical}",
    "Please segment the {finding} in the {location}.",
    "Outline the {finding} in the {location}.",
    "Is there {finding} in the {location}? Segment it.",
    "Show the {finding} in the {location}.",
)


_GLOBAL = (
    "{canonical}",
    "Where is the {finding}? Segment it.",
    "Find and segment the {finding}.",
    "Outline the {finding}.",
)


_LESION = (
    "{canonical}",
    "What type is the opacity in the {location}? Segment it.",
    "Segment the opacity in the {location} and classify it.",
)


def phrasings(instruction: Instruction) -> list[str]:
    """Ways of asking ``instruction``; every one parses back to it (tested)."""
    templates: tuple[str, ...]
    if instruction.kind == "lesion_inference":
        templates = _LESION if instruction.regions else (_LESION[0],)
    else:
        templates = _BASIC if instruction.kind == "basic" else _GLOBAL
    return [
        t.format(canonical=instruction.text, finding=instruction.finding, location=instruction.location)
        for t in templates
    ]
