"""The report side of the MIMIC-ILS pipeline: section choice and structuring into 6-tuples.

A report becomes :class:`~monailabel_xflow.data.mimic_ils.ReportedFinding` tuples in two steps
(MIMIC-ILS §3.1):

1. :func:`choose_section`: the findings section, else the impression, else the last paragraph;
   a report with none of them (empty) raises :class:`SectionNotFound`, whose message is the
   reason the study is skipped.
2. A structurer turns the section into tuples: :class:`RuleStructurer` (the default) is built on
   medspaCy (its PyRuSH sentence splitter, TargetMatcher and ConText, with radiology rules from
   :mod:`~monailabel_xflow.ils.report_rules`); :class:`~monailabel_xflow.ils.report_llm.LLMStructurer`
   asks a local instruction-tuned LLM for JSON instead. Both map locations with
   :func:`map_location` and entities with :func:`finding_of`.

Sentence indices are 1-based over :func:`split_sentences` of the chosen section, which skips
fragments without a letter ("1." of a numbered list). The pipelines are built once per process
(about a second after the imports) and need no model download.

Example::

    >>> structure_report("FINDINGS: Stable small left pleural effusion. No pneumothorax.")
    [ReportedFinding(entity='pleural effusion', sentence=1, present=True, tentative=False,
                     locations=('left lung',), finding='effusion'),
     ReportedFinding(entity='pneumothorax', sentence=2, present=False, tentative=False,
                     locations=(), finding=None)]
"""

from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Protocol

from monailabel_xflow.data.mimic_ils import ReportedFinding
from monailabel_xflow.errors import InputError
from monailabel_xflow.ils import report_rules as R

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc

SECTION_NAMES: tuple[str, ...] = ("findings", "impression", "last_paragraph", "findings+impression")
"""What :attr:`ReportSection.name` can be."""

SECTION_RULES: tuple[str, ...] = ("findings", "findings+impression")
"""How :func:`choose_section` picks: ``"findings"`` (default, the papers' rule: findings, else
impression, else last paragraph) or ``"findings+impression"`` (both together when a report has
both: more recall, since findings stated only in the impression are kept)."""


class SectionNotFound(InputError):
    """A report with no findings, impression or last paragraph: the study is skipped (the
    message says why)."""


class ReportStructuringError(InputError):
    """A structurer could not produce valid tuples (e.g. an LLM's answer failed validation)."""


@dataclass(frozen=True)
class ReportSection:
    """The part of a report that is structured.

    Attributes:
        name: ``"findings"``, ``"impression"`` or ``"last_paragraph"``.
        text: the section body without its header, whitespace-stripped.
    """

    name: str
    text: str


class Structurer(Protocol):
    """Anything that turns a section's text into tuples (sentence indices over
    :func:`split_sentences` of that text)."""

    def __call__(self, section: str) -> list[ReportedFinding]: ...


# --- pipelines -----------------------------------------------------------------------------


def blank_pipeline() -> Language:
    """A blank English spaCy pipeline with medspaCy's tokenizer (PyRuSH's debug log silenced): the
    start of every medspaCy pipeline of the report structurers (add pipes to it)."""
    import spacy
    from loguru import logger
    from medspacy.custom_tokenizer import create_medspacy_tokenizer

    logger.disable("PyRuSH")  # it logs every sentence boundary at DEBUG through loguru
    nlp = spacy.blank("en")
    nlp.tokenizer = create_medspacy_tokenizer(nlp)
    return nlp


def run_pipeline(nlp: Language, text: str) -> Doc:
    """``nlp(text)`` without spaCy's W036: medspaCy's regex matchers stay empty (all our rules are
    phrases or token patterns) and spaCy warns about that on every call."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"\[W036\]")
        return nlp(text)


@functools.cache
def _section_nlp():
    """Tokenizer + medspaCy Sectionizer with radiology headers ("FINDINGS:", "IMPRESSION:", ...)."""
    from medspacy.section_detection import SectionRule

    nlp = blank_pipeline()
    sectionizer = nlp.add_pipe("medspacy_sectionizer", config={"rules": None})
    sectionizer.add([SectionRule(f"{h}:", kind) for kind, hs in R.SECTION_HEADERS.items() for h in hs])
    return nlp


@functools.cache
def _nlp():
    """Tokenizer + PyRuSH sentences + TargetMatcher (findings, devices) + ConText."""
    from medspacy.context import ConTextRule
    from medspacy.target_matcher import TargetRule

    nlp = blank_pipeline()
    nlp.add_pipe("medspacy_pyrush")
    matcher = nlp.add_pipe("medspacy_target_matcher")
    rules = [TargetRule(p, f) for f, ps in R.FINDING_PHRASES.items() for p in ps]
    rules += [TargetRule("cardiomegaly clause", "cardiomegaly_clause", pattern=p) for p in R.CARDIOMEGALY_PATTERNS]
    rules += [TargetRule(p, "OTHER") for p in R.OTHER_FINDINGS]
    rules += [TargetRule(p, "DEVICE") for p in R.DEVICE_PHRASES]
    matcher.add(rules)
    context = nlp.add_pipe("medspacy_context", config={"rules": None})
    ctx_rules = []
    for category, direction, literal in R.CONTEXT_RULES:
        # "resolved" / "no longer" / "cleared" reach both ways, but only a few words
        scope = R.CONTEXT_MAX_SCOPE.get(literal, 6 if direction == "BIDIRECTIONAL" else None)
        ctx_rules.append(ConTextRule(literal, category, direction=direction, max_scope=scope))
    context.add(ctx_rules)
    return nlp


@functools.cache
def _sentence_nlp():
    nlp = blank_pipeline()
    nlp.add_pipe("medspacy_pyrush")
    return nlp


# --- section choice ------------------------------------------------------------------------

_HAS_WORD = re.compile(r"[A-Za-z]{2,}")
_LIST_NUMBER = re.compile(r"^\d{1,2}[.)]\s+")
_LEADING_HEADER = re.compile(r"^\s*[A-Z][A-Z /&()]*:\s*")


def _usable(text: str) -> bool:
    return bool(_HAS_WORD.search(text))


def choose_section(report: str, rule: str = "findings") -> ReportSection:
    """The section MIMIC-ILS structures: findings, else impression, else the last paragraph.

    Headers are found by medspaCy's Sectionizer (a header word and a colon, any case:
    "FINDINGS:", "Impression:"); a section whose body has no word counts as missing. The last
    paragraph is the last blank-line-separated block with a word, its own header (if any)
    removed.

    Args:
        report: the whole free-text report.
        rule: ``"findings"`` (default, the papers' rule) or ``"findings+impression"``: a report
            with both gets them together, findings first, as one section named
            ``"findings+impression"`` (sentence indices run on through the impression); a report
            with one of them gets that one, as under the default.

    Returns:
        The chosen :class:`ReportSection`.

    Raises:
        SectionNotFound: the report is empty or has no words; the message is the skip reason.
        TypeError: ``report`` is not a string.
        ValueError: ``rule`` is not one of :data:`SECTION_RULES`.
    """
    if not isinstance(report, str):
        raise TypeError(f"a report is text, got {type(report).__name__}")
    if rule not in SECTION_RULES:
        raise ValueError(f"unknown section rule {rule!r}; supported: {', '.join(SECTION_RULES)}")
    if not _usable(report):
        raise SectionNotFound("no findings, impression or last paragraph: the report has no text")
    doc = run_pipeline(_section_nlp(), report)
    bodies: dict[str, str] = {}
    for sec in doc._.sections:
        if sec.category in ("findings", "impression") and sec.category not in bodies:
            body = doc[sec.body_start : sec.body_end].text.strip() if sec.body_end > sec.body_start else ""
            if _usable(body):
                bodies[sec.category] = body
    if rule == "findings+impression" and len(bodies) == 2:
        return ReportSection("findings+impression", bodies["findings"] + "\n\n" + bodies["impression"])
    for name in ("findings", "impression"):
        if name in bodies:
            return ReportSection(name, bodies[name])
    for para in reversed(re.split(r"\n\s*\n", report)):
        body = _LEADING_HEADER.sub("", para.strip()).strip()
        if _usable(body):
            return ReportSection("last_paragraph", body)
    raise SectionNotFound("no findings, impression or last paragraph with text")  # pragma: no cover


def split_sentences(text: str) -> list[str]:
    """The sentences of a section as the structurers number them (1-based in the tuples).

    PyRuSH's splits, whitespace-stripped, without fragments that hold no letter and without a
    leading list number ("2. No pneumothorax." -> "No pneumothorax.").
    """
    return [
        _LIST_NUMBER.sub("", s.text.strip())
        for s in run_pipeline(_sentence_nlp(), text).sents
        if any(c.isalpha() for c in s.text)
    ]


# --- vocabulary mapping --------------------------------------------------------------------

_ENTITY_TO_FINDING = {p: f for f, ps in R.FINDING_PHRASES.items() for p in ps}


def finding_of(entity: str) -> str | None:
    """The vocabulary finding an entity names ("pleural effusions" -> effusion), else None.

    Exact synonyms first, then the longest synonym inside the phrase ("small left pleural
    effusion" -> effusion); "enlarged" alone (anatomy moved out of "heart is enlarged") ->
    cardiomegaly.
    """
    e = " ".join(entity.lower().replace("_", " ").split()).strip(" .")
    if e in _ENTITY_TO_FINDING:
        return _ENTITY_TO_FINDING[e]
    if e in R.ENTITY_SYNONYMS:
        return R.ENTITY_SYNONYMS[e]
    if e in ("enlarged", "enlargement", "enlarged heart size", "cardiac silhouette enlargement"):
        return "cardiomegaly"
    hits = [(len(p), f) for p, f in _ENTITY_TO_FINDING.items() if re.search(rf"\b{re.escape(p)}\b", e)]
    if any(o in e for o in ("pneumothorax", "congestion", "nodul", "mass")):
        return None  # "fluid" in "hydropneumothorax", "vascular congestion" are not our findings
    other = max((len(p) for p in R.OTHER_FINDINGS if re.search(rf"\b{re.escape(p)}\b", e)), default=0)
    if hits and other > max(hits)[0]:
        return None  # "pericardial effusion", "prior granulomatous infection": not our findings
    return max(hits)[1] if hits else None


_WORD = re.compile(r"[a-z]+")
_COMPARED_SIDES = re.compile(
    r" (?:right|left) (?:[a-z]+ ){0,2}?(?:greater|more|worse|larger) than (?:the )?(?:right|left) "
)


def _sides_for(tokens: list[str], i: int) -> tuple[str, ...]:
    """Side(s) a part word at ``i`` takes: its own (bibasilar), the last side word before it,
    else the first after it, else both."""
    own = R.SIDE_WORDS.get(tokens[i])
    if own:
        return own
    before = [R.SIDE_WORDS[t] for t in tokens[:i] if t in R.SIDE_WORDS]
    if before:
        return before[-1]
    after = [R.SIDE_WORDS[t] for t in tokens[i + 1 :] if t in R.SIDE_WORDS]
    return after[0] if after else ("right", "left")


def _is_lobe(tokens: list[str], i: int) -> bool:
    """Whether part word ``i`` names a lobe: upper / middle / lower whose first noun after is
    lobe(s) ("right upper and left lower lobes"); "basilar", "apical" never do."""
    if tokens[i] not in ("upper", "lower", "middle", "mid"):
        return False
    for t in tokens[i + 1 :]:
        if t in ("lobe", "lobes", "lobar"):
            return True
        if t in R.ZONE_PARTS or t in R.SIDE_WORDS or t in ("and", "or", "the", "to"):
            continue
        return False
    return False


def map_location(phrase: str) -> tuple[str, ...]:
    """Map a location phrase to MIMIC-ILS labels (the paper's two-step location mapping).

    Step 1 picks the categories of :data:`~monailabel_xflow.data.mimic_ils.LOCATION_CATEGORIES`;
    for lung, step 2 picks fine labels: the eight zones and two lungs of
    :mod:`~monailabel_xflow.vocabulary` and the five lobes of
    :data:`~monailabel_xflow.data.mimic_ils.LUNG_LOBES`. Overlapping terms give several labels.

    Examples: "bibasilar" -> (right lung base, left lung base); "retrocardiac" -> (left lung
    base,); "left" -> (left lung,); "bilateral" -> (right lung, left lung); "right upper and
    left lower lobes" -> (right upper lobe, left lower lobe); "lingula" -> (left upper lobe,);
    "hilar" -> (lung,); "left hemidiaphragm" -> (diaphragm,); "mid thoracic spine" ->
    (thoracic spine,); "posterior costophrenic sulcus" -> (lateral view location,).

    Args:
        phrase: location words as written.

    Returns:
        Labels in the order named, without repeats; ``()`` when nothing matches.
    """
    text = " " + " ".join(_WORD.findall(phrase.lower().replace("mid-lung", "midlung"))) + " "
    text = _COMPARED_SIDES.sub(" bilateral ", text)  # "right greater than left": both sides
    categories: list[str] = []
    for ph, cat in R.CATEGORY_PHRASES.items():
        if f" {ph} " in text:
            categories.append(cat)
            text = text.replace(f" {ph} ", " ")
    tokens = text.split()
    categories += [R.CATEGORY_WORDS[t] for t in tokens if t in R.CATEGORY_WORDS]
    lung: list[str] = []
    for i, t in enumerate(tokens):
        if t in ("hilar", "perihilar", "hilum") and any(u in R.SIDE_WORDS for u in tokens):
            lung += [f"{s} lung" for s in _sides_for(tokens, i)]
        elif t in ("lingula", "lingular"):
            lung.append("left upper lobe")
        elif t == "retrocardiac":
            lung.append("left lung base")
        elif t == "costophrenic":
            lung += [R.ZONE_OF[(s, 3)] for s in _sides_for(tokens, i)]
        elif t in R.ZONE_PARTS:
            part = R.ZONE_PARTS[t]
            if _is_lobe(tokens, i):
                sides = _sides_for(tokens, i)
                if part == 2 and tokens[i] in ("middle", "mid"):
                    sides = ("right",)  # only the right lung has a middle lobe
                lung += [R.LOBE_OF[(s, part)] for s in sides]
            elif t in ("upper", "lower", "mid", "middle") and not any(
                n in tokens[i + 1 :] for n in ("lung", "lungs", "zone", "zones", "field", "fields")
            ):
                continue  # "upper abdomen", "lower thoracic spine": not a lung zone
            else:
                lung += [R.ZONE_OF[(s, part)] for s in _sides_for(tokens, i)]
    nouns = [t for t in tokens if t in R.LUNG_NOUNS or t in R.SIDELESS_LUNG]
    strong_nouns = [t for t in nouns if t in R.LUNG_NOUNS]
    said = [s for t in tokens if t in R.SIDE_WORDS for s in R.SIDE_WORDS[t]]
    if not lung and (strong_nouns or (not categories and (said or nouns))):
        if said:
            lung = [f"{s} lung" for s in ("right", "left") if s in said]
        elif any(t in ("lungs", "hemithoraces", "hila") for t in tokens):
            lung = ["right lung", "left lung"]
        elif nouns:
            lung = ["lung"]
    return tuple(dict.fromkeys(lung + categories))


# --- the rule-based structurer -------------------------------------------------------------

_LOCATION_WORDS = (
    set(R.SIDE_WORDS)
    | set(R.ZONE_PARTS)
    | set(R.LUNG_NOUNS)
    | set(R.CATEGORY_WORDS)
    | set(R.SIDELESS_LUNG)
    | {w for p in R.CATEGORY_PHRASES for w in p.split()}
    | {"costophrenic", "retrocardiac", "lingula"}
)
_CONNECTORS = set(R.LOCATION_CONNECTORS)
_PREPOSITIONS = set(R.LOCATION_PREPOSITIONS)
_MODIFIERS = set(R.FINDING_MODIFIERS)
_HEDGES = set(R.TENTATIVE_LINKS)
_ALTERNATIVES = set(R.ALTERNATIVE_WORDS)
_LINK = re.compile(r"\b(" + "|".join(sorted((re.escape(x) for x in R.TYPE_LINKS), key=len, reverse=True)) + r")\b")


@dataclass
class _Mention:
    start: int  # token indices in the doc
    end: int
    label: str  # a finding, "OTHER", "DEVICE"
    entity: str
    present: bool
    tentative: bool
    skip: bool  # hypothetical: not a statement about this image
    pre: list
    post: list
    finding: str | None
    hedge: str | None = None  # a grade of R.HEDGE_GRADES when tentative


def _mention(ent) -> _Mention:
    label = ent.label_
    entity = ent.text
    locs: list[str] = []
    present = not ent._.is_negated
    if label == "cardiomegaly_clause":  # "the heart is (not) enlarged": anatomy out of the entity
        words = [t.lower_ for t in ent]
        entity = ent[-1].text
        locs = ["heart"]
        present = present and not ({"not", "no"} & set(words))
        label = "cardiomegaly"
    finding = label if label not in ("OTHER", "DEVICE") else None
    # "borderline heart size" is a hedge inside the phrase itself, out of ConText's reach
    tentative = bool(ent._.is_uncertain) or "borderline" in entity.lower()
    hedge = None
    if ent._.is_uncertain:
        hedge = weakest_hedge(
            # "pneumonia is favored over atelectasis": what comes after "over" is the alternative
            "alternative" if m.rule.literal.endswith(" over") and ent.start >= m.modifier_span[1] else m.rule.literal
            for m in ent._.modifiers
            if m.category == "POSSIBLE_EXISTENCE"
        )
    if "borderline" in entity.lower():
        hedge = weakest_hedge([hedge, "borderline"])
    return _Mention(
        ent.start, ent.end, label, entity, present, tentative, bool(ent._.is_hypothetical), locs, [], finding, hedge
    )


def hedge_grade(cue: str | None) -> str | None:
    """The grade of :data:`~monailabel_xflow.ils.report_rules.HEDGE_GRADES` a hedge cue (a
    ConText literal or a link word: "likely", "may", "versus") or a grade itself stands for;
    None for None. Any cue that is neither probable nor an alternative is ``"possible"``."""
    if cue is None:
        return None
    c = " ".join(cue.lower().split())
    if c in R.HEDGE_GRADES:
        return c
    if c in R.PROBABLE_HEDGES:
        return "probable"
    if c in R.ALTERNATIVE_HEDGES:
        return "alternative"
    return "possible"


def weakest_hedge(cues) -> str | None:
    """The weakest grade among hedge cues or grades (alternative < possible < probable), None
    when there is none."""
    grades = [g for g in map(hedge_grade, cues) if g is not None]
    return max(grades, key=R.HEDGE_GRADES.index) if grades else None


def _groups(sent, taken: set[int]) -> list[tuple[int, int]]:
    """Runs of location words (token index ranges) in a sentence, outside finding spans."""
    out: list[tuple[int, int]] = []
    start: int | None = None
    last_cue = -1  # set with start
    for tok in sent:
        w = tok.lower_
        if tok.i in taken:
            cue = conn = False
        else:
            cue = w in _LOCATION_WORDS
            conn = w in _CONNECTORS
        if cue:
            if start is None:
                start = tok.i
            last_cue = tok.i
        elif conn and start is not None:
            continue
        else:
            if start is not None:
                out.append((start, last_cue + 1))
            start = None
    if start is not None:
        out.append((start, last_cue + 1))
    return out


class RuleStructurer:
    """The default structurer: medspaCy TargetMatcher + ConText with radiology rules.

    Per sentence of the section: finding and device mentions are matched (longest phrase
    wins); ConText sets absent (negated or resolved) and tentative; runs of location words are
    mapped with :func:`map_location` and attached to the finding they modify (just before it,
    "left lower lobe consolidation"; or after it behind a preposition, "opacity in the right
    base"; or a sentence-opening phrase, "At the left base, there is atelectasis"); coordinated
    findings share a location ("bibasilar atelectasis and effusions"); a zone word without a side
    takes the one side its sentence names; findings offered as alternatives ("atelectasis versus
    pneumonia") are both tentative; an opacity or
    consolidation tied to a specific finding by "reflects", "likely", "concerning for", ...
    takes it as its predicted type and the specific mention is folded into it. Devices take
    their own location words and are then dropped; hypothetical mentions ("evaluate for
    pneumonia") are dropped.
    """

    def __call__(self, section: str) -> list[ReportedFinding]:
        doc = run_pipeline(_nlp(), section)
        out: list[ReportedFinding] = []
        sents = [s for s in doc.sents if any(c.isalpha() for c in s.text)]
        for index, sent in enumerate(sents, 1):
            ents = [e for e in doc.ents if e.start >= sent.start and e.end <= sent.end]
            mentions = [_mention(e) for e in ents]
            self._locate(doc, sent, mentions)
            self._hedge_alternatives(doc, mentions)
            mentions = self._fold_predicted_types(doc, mentions)
            for m in mentions:
                if m.label == "DEVICE" or m.skip:
                    continue
                locs = tuple(dict.fromkeys(m.pre + m.post))
                hedge = (m.hedge or "possible") if m.tentative else None
                out.append(ReportedFinding(m.entity, index, m.present, m.tentative, locs, m.finding, hedge))
        return out

    @staticmethod
    def _locate(doc, sent, mentions: list[_Mention]) -> None:
        taken = {i for m in mentions for i in range(m.start, m.end)}
        # a zone word without a side takes the one side the sentence names ("left effusion with
        # basilar atelectasis": the left base), else both
        named = {s for t in sent if t.lower_ in R.SIDE_WORDS for s in R.SIDE_WORDS[t.lower_]}
        for g0, g1 in _groups(sent, taken):
            words = [t.lower_ for t in doc[g0:g1]]
            phrase = doc[g0:g1].text
            if len(named) == 1 and not set(words) & set(R.SIDE_WORDS) and set(words) & set(R.ZONE_PARTS):
                phrase = f"{next(iter(named))} {phrase}"
            labels = list(map_location(phrase))
            if not labels:
                continue
            nxt = next((m for m in mentions if m.start >= g1), None)
            prv = next((m for m in reversed(mentions) if m.end <= g0), None)
            between_next = [t.lower_ for t in doc[g1 : nxt.start]] if nxt else []
            if nxt is not None and len(between_next) <= 5 and all(w in _MODIFIERS for w in between_next):
                nxt.pre += labels
                continue
            if prv is not None:
                gap = [t.lower_ for t in doc[prv.end : g0]]
                if (
                    gap
                    and (
                        gap[-1] in _PREPOSITIONS
                        or gap[-2:-1]
                        and gap[-2] in _PREPOSITIONS
                        and gap[-1] in ("the", "both", "a")
                    )
                    and ";" not in gap
                ):
                    prv.post += labels
                    continue
                if gap in ([","], ["at"], ["in"]):
                    prv.post += labels
                    continue
            lead = [t.lower_ for t in doc[sent.start : g0]]
            if (
                nxt is not None
                and lead
                and lead[0] in _PREPOSITIONS
                and all(w in _PREPOSITIONS or w in ("the", "a", "both") for w in lead)
            ):
                nxt.pre += labels  # "At the left base, there is atelectasis."
        # coordinated findings share locations: "bibasilar atelectasis and effusions"
        for a, b in pairwise(mentions):
            gap = [t.lower_ for t in doc[a.end : b.start]]
            if not gap or not set(gap) <= {"and", "or", ","} | _MODIFIERS:
                continue
            if a.pre and not (b.pre or b.post) and "DEVICE" not in (a.label, b.label):
                b.pre = list(a.pre)
            if b.post and not (a.pre or a.post) and "DEVICE" not in (a.label, b.label):
                a.post = list(b.post)

    @staticmethod
    def _hedge_alternatives(doc, mentions: list[_Mention]) -> None:
        """Present findings offered as alternatives ("atelectasis or pneumonia", "atelectasis
        versus pneumonia") are both tentative: the report commits to neither."""
        for a, b in pairwise(mentions):
            gap = [t.lower_ for t in doc[a.end : b.start]]
            if (
                a.present
                and b.present
                and "DEVICE" not in (a.label, b.label)
                and set(gap) & _ALTERNATIVES
                and set(gap) <= _ALTERNATIVES | _MODIFIERS | {",", "either"}
            ):
                a.tentative = b.tentative = True
                a.hedge, b.hedge = weakest_hedge([a.hedge, "alternative"]), weakest_hedge([b.hedge, "alternative"])

    @staticmethod
    def _fold_predicted_types(doc, mentions: list[_Mention]) -> list[_Mention]:
        out: list[_Mention] = []
        skip: set[int] = set()
        for k, m in enumerate(mentions):
            if k in skip:
                continue
            nxt = mentions[k + 1] if k + 1 < len(mentions) else None
            if nxt is not None and m.finding in R.PREDICTED_TYPES and nxt.finding in R.PREDICTED_TYPES[m.finding]:
                between = doc[m.end : nxt.start].text.lower()
                if _LINK.search(between) and ";" not in between:
                    words = set(_WORD.findall(between))
                    m.finding = nxt.finding
                    # a hedge in the link hedges the type of a present opacity; in "no consolidation
                    # to suggest pneumonia" it is part of a definite negative
                    hedged = nxt.tentative or bool(words & _HEDGES) or "cannot" in between
                    if hedged and m.present:  # the weakest of the two mentions' hedges and the link's
                        cues = [m.hedge, nxt.hedge if nxt.tentative else None, *sorted(words & _HEDGES)]
                        m.hedge = weakest_hedge(cues + (["cannot"] if "cannot" in between else []))
                    m.tentative = m.tentative or (hedged and m.present)
                    # presence is the opacity's ("no opacity to suggest pneumonia": absent)
                    if not (m.pre or m.post):
                        m.pre, m.post = list(nxt.pre), list(nxt.post)
                    skip.add(k + 1)
            out.append(m)
        return out


# --- entry points --------------------------------------------------------------------------


@functools.cache
def default_structurer() -> RuleStructurer:
    return RuleStructurer()


def structure_section(section: str, structurer: Structurer | None = None) -> list[ReportedFinding]:
    """Tuples of one section's text (sentence indices over :func:`split_sentences`)."""
    return (structurer or default_structurer())(section)


def structure_report(
    report: str, structurer: Structurer | None = None, section_rule: str = "findings"
) -> list[ReportedFinding]:
    """Choose the section of a whole report (:func:`choose_section`) and structure it.

    Args:
        report: the free-text report.
        structurer: default :class:`RuleStructurer`; or e.g. an
            :class:`~monailabel_xflow.ils.report_llm.LLMStructurer`.
        section_rule: :data:`SECTION_RULES` (default the papers' findings-first rule).

    Returns:
        One :class:`ReportedFinding` per finding mentioned, in reading order; ``[]`` when the
        section names none (a normal study).

    Raises:
        SectionNotFound: nothing to structure (the message is the skip reason).
    """
    return structure_section(choose_section(report, section_rule).text, structurer)
