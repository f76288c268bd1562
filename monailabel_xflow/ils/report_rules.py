"""The rule sets of the rule-based report structurer (:mod:`monailabel_xflow.ils.report`).

Plain data only: finding and device phrases for medspaCy's TargetMatcher, radiology ConText
modifiers, section headers for the Sectionizer, and the location lexicon. Kept apart from the
code so a site can read (and extend) what the structurer knows in one place.

Choices where the MIMIC-ILS paper is silent (a radiology-AI engineer's reading, documented so
they can be argued with):

* **Finding synonyms** map to :data:`~monailabel_xflow.vocabulary.FINDINGS`: "pleural effusion",
  "pleural fluid", "layering fluid" -> effusion; "pulmonary edema", "interstitial edema",
  "fluid / volume overload", "(congestive) heart failure", "CHF", "Kerley B lines",
  "indistinct pulmonary vasculature" -> edema (the CheXpert labeler's mention list and the
  Fleischner glossary; soft-tissue, subcutaneous, chest-wall, bowel-wall edema and anasarca are
  not); "airspace disease", "infiltrate", "airspace density",
  "retrocardiac density", "haziness" -> opacity; "enlarged heart", "cardiac enlargement", "the
  heart (size) is (mildly) enlarged", "heart size mildly enlarged", "enlarged cardiomediastinal
  silhouette", "borderline heart size" (tentative) -> cardiomegaly; "infection", "infectious
  process", "aspiration", "pneumonic / infectious infiltrate", "superimposed infection",
  "aspiration pneumonitis" -> pneumonia (as the CheXpert labeler does; viral, urinary or upper
  respiratory infection, foreign-body or needle aspiration and bare "pneumonitis" are not); "collapse" -> atelectasis.
  Kept out, as entities of their own with no finding type: bare "fluid" and "density", "bone /
  soft tissue density", "interstitial markings", "pericardial effusion", "(prior) granulomatous
  infection". **"Vascular congestion" is not edema** here (the CheXpert labeler
  lumps them): congestion is a vascular sign, and a mask for it would teach a model to segment
  vessels as edema; it is kept as its own entity with no finding type.
* Words that are part of a finding's name stay in the entity ("*pleural* effusion",
  "*pulmonary* edema", "*airspace* disease"); other anatomy words are moved to the location
  ("hilar adenopathy" -> adenopathy @ hilar; "the heart is enlarged" -> enlarged @ heart).
* **Certainty**: "possible", "probable", "likely", "may/could/might", "suggest(s/ive of)",
  "concerning/suspicious/worrisome for", "questionable", "cannot be excluded/ruled out",
  "versus", "presumed", "differential (diagnosis) includes", "correlate clinically for",
  "question ...", "favored", "would be (consistent with)" are tentative; "consistent with",
  "compatible with", "in keeping with", "represents", "reflects", "due to" are definitive.
  **Alternatives** ("atelectasis or pneumonia", "atelectasis versus pneumonia") are both
  tentative: the report commits to neither. Every tentative tuple is graded
  (:data:`HEDGE_GRADES`: probable / possible / alternative), and per finding
  :data:`TENTATIVE_COUNTS_AS` says which grades still name the finding in a report-level label.
  A tentative finding stays a present tuple; what a
  tentative tuple means downstream is MIMIC-ILS §C.1: its positive prompt names an *opacity*,
  not the finding (:mod:`~monailabel_xflow.ils.pairs`).
* A hedge between an opacity and its predicted type makes the tuple tentative only when the
  opacity is present ("no consolidation to suggest pneumonia" is a definite negative).
* **Presence**: "stable", "unchanged", "no change in", "persistent", "partially resolved",
  "improving" keep a finding present; "resolved", "resolution of", "no longer seen", "has
  cleared" make it absent; "clear" / "normal" statements are not extracted at all.
* **Location words without a side** take the one side their sentence names ("left effusion
  with basilar atelectasis": the left base), else both sides ("bibasilar", "the bases", "upper
  lobes", "apical" -> right and left); "right greater than left" is both sides; singular
  "lung" / "pulmonary" with no side give the category ``lung``; "retrocardiac" is the left lung
  base; "hilar" / "perihilar" are lung (side-specific when a side is named).
"""

from __future__ import annotations

from monailabel_xflow.data.mimic_ils import LUNG_LOBES
from monailabel_xflow.vocabulary import ZONES

# --- findings (TargetMatcher) ----------------------------------------------------------------

FINDING_PHRASES: dict[str, tuple[str, ...]] = {
    "cardiomegaly": (
        "cardiomegaly",
        "cardiac enlargement",
        "enlarged heart",
        "enlargement of the heart",
        "enlargement of the cardiac silhouette",
        "enlarged cardiac silhouette",
        "enlarged cardiomediastinal silhouette",
        "enlargement of the cardiomediastinal silhouette",
        "borderline heart size",
        "borderline cardiomegaly",
        "borderline cardiac size",
        "borderline enlarged heart",
        "borderline enlargement of the heart",
    ),
    "pneumonia": (
        "pneumonia",
        "pneumonias",
        "pneumonic",
        "bronchopneumonia",
        "infection",
        "infectious process",
        "aspiration",
        "pneumonic consolidation",
        "pneumonic infiltrate",
        "pneumonic infiltrates",
        "infectious infiltrate",
        "infectious infiltrates",
        "infectious consolidation",
        "superinfection",
        "superimposed infection",
        "aspiration pneumonitis",
        "multifocal pneumonia",
        "lobar pneumonia",
        "round pneumonia",
    ),
    "atelectasis": (
        "atelectasis",
        "atelectases",
        "atelectatic",
        "atelectatic change",
        "atelectatic changes",
        "collapse",
        "lobar collapse",
    ),
    "opacity": (
        "opacity",
        "opacities",
        "opacification",
        "opacifications",
        "airspace disease",
        "air space disease",
        "airspace opacity",
        "airspace opacities",
        "haziness",
        "airspace density",
        "air space density",
        "airspace densities",
        "parenchymal density",
        "parenchymal densities",
        "retrocardiac density",
        "alveolar density",
        "pulmonary density",
        "increased density",
        "patchy density",
        "patchy densities",
        "streaky density",
        "streaky densities",
        "linear density",
        "linear densities",
        "focal density",
        "hazy density",
        "ill-defined density",
        "lung density",
        "lung densities",
        "nodular density",
        "infiltrate",
        "infiltrates",
        "infiltration",
        "interstitial opacities",
        "reticular opacities",
    ),
    "consolidation": (
        "consolidation",
        "consolidations",
        "consolidative opacity",
        "consolidative opacities",
        "consolidated",
    ),
    "edema": (
        "edema",
        "oedema",
        "pulmonary edema",
        "interstitial edema",
        "alveolar edema",
        "interstitial pulmonary edema",
        "pulmonary interstitial edema",
        "pulmonary oedema",
        "interstitial pulmonary oedema",
        "airspace edema",
        "air space edema",
        "alveolar pulmonary edema",
        "perihilar edema",
        "hydrostatic edema",
        "hydrostatic pulmonary edema",
        "cardiogenic edema",
        "cardiogenic pulmonary edema",
        "noncardiogenic pulmonary edema",
        "non-cardiogenic pulmonary edema",
        "fluid overload",
        "volume overload",
        "congestive heart failure",
        "congestive failure",
        "heart failure",
        "chf",
        "kerley b lines",
        "kerley b-lines",
        "kerley lines",
        "vascular indistinctness",
        "indistinct pulmonary vasculature",
        "indistinct vasculature",
        "indistinctness of the pulmonary vasculature",
        "indistinctness of the pulmonary vessels",
        "perihilar indistinctness",
    ),
    "effusion": (
        "effusion",
        "effusions",
        "pleural effusion",
        "pleural effusions",
        "pleural fluid",
        "layering fluid",
        "fissural fluid",
        "subpulmonic fluid",
        "fluid in the pleural space",
        "hydrothorax",
    ),
}
"""Phrases per vocabulary finding the TargetMatcher looks for; the longest match wins ("fluid
overload" beats "pleural fluid"). Bare "fluid", "density" and "interstitial markings" are not
among them: in real reports they name stomach fluid, bone or soft-tissue density and chronic
interstitial change as often as an effusion or an opacity."""

ENTITY_SYNONYMS: dict[str, str] = {"fluid": "effusion", "density": "opacity", "densities": "opacity"}
"""Entity names an LLM structurer may answer with (already separated from their location words,
"fluid" @ pleural) that name a finding; never searched for in text."""

# "The heart is (mildly) enlarged", "heart size is enlarged", "cardiac silhouette remains enlarged".
_ADVERBS = [
    "mildly",
    "moderately",
    "severely",
    "markedly",
    "slightly",
    "minimally",
    "again",
    "still",
    "stably",
    "significantly",
    "somewhat",
    "borderline",
    "not",
    "no",
    "longer",
    "substantially",
]
CARDIOMEGALY_PATTERNS: tuple[list[dict], ...] = (
    [
        {"LOWER": {"IN": ["heart", "cardiac", "cardiomediastinal"]}},
        {"LOWER": {"IN": ["size", "silhouette", "contour", "shadow"]}, "OP": "?"},
        {"LOWER": {"IN": ["is", "remains", "appears", "was", "seems", "looks"]}, "OP": "?"},
        {"LOWER": {"IN": _ADVERBS}, "OP": "*"},
        {"LOWER": {"IN": ["enlarged", "large", "increased"]}},
    ],
)
"""Token patterns for cardiomegaly written as a clause, the verb optional ("heart size mildly
enlarged", "the cardiomediastinal silhouette is enlarged"); anatomy words become the location."""

OTHER_FINDINGS: tuple[str, ...] = (
    "pneumothorax",
    "pneumothoraces",
    "hydropneumothorax",
    "nodule",
    "nodules",
    "mass",
    "masses",
    "fracture",
    "fractures",
    "adenopathy",
    "lymphadenopathy",
    "emphysema",
    "fibrosis",
    "scarring",
    "scar",
    "granuloma",
    "granulomas",
    "calcification",
    "calcifications",
    "hernia",
    "thickening",
    "congestion",
    "engorgement",
    "tortuosity",
    "widening",
    "degenerative changes",
    "degenerative change",
    "scoliosis",
    "kyphosis",
    "hyperinflation",
    "bronchiectasis",
    "free air",
    "pneumomediastinum",
    "subcutaneous emphysema",
    "volume loss",
    "elevation",
    "blunting",
    "deformity",
    "cavitation",
    "cavity",
    "lesion",
    "lesions",
    "air-fluid level",
    "pneumoperitoneum",
    "cyst",
    # near-synonyms that are not the seven: matched so the shorter finding word inside them is not
    "pericardial effusion",
    "pericardial effusions",
    "pericardial fluid",
    "granulomatous infection",
    "granulomatous disease",
    "prior granulomatous infection",
    "old granulomatous disease",
    "prior infection",
    "previous infection",
    "old infection",
    "interstitial markings",
    "interstitial marking",
    "bone density",
    "soft tissue density",
    "soft tissue densities",
    "breast density",
    "nipple density",
    "calcified density",
    # edema that is not pulmonary edema (the labelers' "unmention" idea; our own list)
    "soft tissue edema",
    "subcutaneous edema",
    "chest wall edema",
    "body wall edema",
    "anasarca",
    "mucosal edema",
    "airway edema",
    "laryngeal edema",
    "bowel wall edema",
    "gallbladder wall edema",
    "periportal edema",
    "marrow edema",
    "bone marrow edema",
    "scalp edema",
    "pedal edema",
    "extremity edema",
    # infection / aspiration that is not pneumonia
    "viral infection",
    "viral infections",
    "upper respiratory infection",
    "upper respiratory tract infection",
    "urinary tract infection",
    "sinus infection",
    "ear infection",
    "soft tissue infection",
    "wound infection",
    "line infection",
    "foreign body aspiration",
    "aspirated foreign body",
    "needle aspiration",
    "fine needle aspiration",
    "aspiration precautions",
    "aspiration risk",
    "risk of aspiration",
    "pneumonitis",
    "radiation pneumonitis",
    "hypersensitivity pneumonitis",
)
"""Findings outside the seven: extracted with ``finding=None`` (they still occupy locations)."""

DEVICE_PHRASES: tuple[str, ...] = (
    "tube",
    "tubes",
    "endotracheal tube",
    "et tube",
    "ett",
    "enteric tube",
    "nasogastric tube",
    "ng tube",
    "orogastric tube",
    "og tube",
    "feeding tube",
    "dobhoff",
    "dobhoff tube",
    "chest tube",
    "chest tubes",
    "tracheostomy",
    "tracheostomy tube",
    "line",
    "lines",
    "central line",
    "central venous line",
    "central venous catheter",
    "catheter",
    "picc",
    "picc line",
    "port",
    "port-a-cath",
    "swan-ganz catheter",
    "pacemaker",
    "pacer",
    "icd",
    "defibrillator",
    "leads",
    "lead",
    "wires",
    "sternotomy wires",
    "median sternotomy",
    "sternotomy",
    "clips",
    "surgical clips",
    "stent",
    "valve",
    "valve replacement",
    "prosthetic valve",
    "drain",
    "pigtail catheter",
    "monitoring leads",
    "ecg leads",
    "iabp",
    "intra-aortic balloon pump",
    "impella",
    "lvad",
    "hardware",
    "spinal hardware",
    "loop recorder",
    "coil",
    "coils",
    "staples",
    "sutures",
    "cabg",
)
"""Medical devices: matched so they take their own location words, then ignored (MIMIC-ILS)."""

# --- ConText modifiers (category, direction, literal) -------------------------------------------

CONTEXT_RULES: tuple[tuple[str, str, str], ...] = (
    # absent
    *[
        ("NEGATED_EXISTENCE", "FORWARD", s)
        for s in (
            "no",
            "not",
            "without",
            "negative for",
            "free of",
            "clear of",
            "no evidence of",
            "no definite",
            "no convincing",
            "no radiographic evidence of",
            "no signs of",
            "absence of",
            "absent",
            "resolution of",
            "interval resolution of",
            "rather than",
            "nor",
            "no new",
            "there is no",
            "there are no",
            "no focal",
            "no large",
            "no acute",
        )
    ],
    *[
        ("NEGATED_EXISTENCE", "BACKWARD", s)
        for s in (
            "has resolved",
            "have resolved",
            "has cleared",
            "have cleared",
            "is absent",
            "are absent",
            "not seen",
            "is not seen",
            "are not seen",
            "not visualized",
            "not identified",
            "not appreciated",
            "not evident",
            "not detected",
            "not present",
            "is not present",
            "are not present",
            "ruled out",
            "unlikely",
            "is gone",
            "have disappeared",
            "has disappeared",
        )
    ],
    *[("NEGATED_EXISTENCE", "BIDIRECTIONAL", s) for s in ("resolved", "no longer", "cleared")],
    ("POSSIBLE_EXISTENCE", "BIDIRECTIONAL", "suspected"),
    # stable / changed: keep the finding present ("no change in the effusion" is an effusion)
    *[
        ("PSEUDO", "PSEUDO", s)
        for s in (
            "no change",
            "no significant change",
            "no interval change",
            "no significant interval change",
            "no substantial change",
            "no appreciable change",
            "no change in",
            "not significantly changed",
            "not changed",
            "no increase",
            "no decrease",
            "no significant increase",
            "no significant decrease",
            "without change",
            "without significant change",
            "without interval change",
            "no worsening",
            "partial resolution",
            "partially resolved",
            "incomplete resolution",
            "not only",
            "no longer intubated",
            "not well seen",
            "not well visualized",
            "no longer than",
        )
    ],
    # tentative
    *[
        ("POSSIBLE_EXISTENCE", "FORWARD", s)
        for s in (
            "possible",
            "possibly",
            "probable",
            "probably",
            "likely",
            "most likely",
            "may",
            "may represent",
            "may reflect",
            "may be",
            "could",
            "could represent",
            "could reflect",
            "could be",
            "might",
            "suggest",
            "suggests",
            "suggesting",
            "suggestive of",
            "suspicious for",
            "concerning for",
            "worrisome for",
            "questionable",
            "question of",
            "cannot exclude",
            "can not exclude",
            "cannot rule out",
            "differential includes",
            "versus",
            "vs",
            "presumed",
            "presumably",
            "equivocal",
            "raising the possibility of",
            "difficult to exclude",
            "suspect",
            "concern for",
            "borderline",
            "potentially",
            "not excluded",
            "differential diagnosis includes",
            "differential diagnosis would include",
            "differential considerations include",
            "differential considerations",
            "differential diagnosis",
            "differential",
            "question",
            "questionable for",
            "correlate clinically for",
            "clinically correlate for",
            "correlate for",
            "clinical correlation for",
            "correlate clinically to exclude",
            "correlation for",
            "cannot be distinguished from",
            "either",
            "favor",
            "favored",
            "favoring",
            "may represent either",
            "would be",
            "would favor",
            "would be consistent with",
            "would be most consistent with",
            "with or without",
            "less likely",
            "unsure whether",
            "uncertain whether",
            "unclear whether",
            "unclear if",
            "can be seen with",
            "can be seen in",
            "may be seen with",
            "may be seen in",
            "could be seen with",
            "cannot be differentiated from",
            "cannot be distinguished from",
        )
    ],
    *[
        ("POSSIBLE_EXISTENCE", "BACKWARD", s)
        for s in (
            "cannot be excluded",
            "can not be excluded",
            "not be excluded",
            "is not excluded",
            "cannot be ruled out",
            "can not be ruled out",
            "not ruled out",
            "are not excluded",
            "is possible",
            "is suspected",
            "are suspected",
            "is likely",
            "are likely",
            "is not excluded",
            "is questioned",
            "?",
            "is favored",
            "are favored",
            "cannot be completely excluded",
            "cannot be entirely excluded",
            "not completely excluded",
            "not entirely excluded",
            "cannot be completely ruled out",
            "in the appropriate clinical setting",
            "in the right clinical setting",
            "is less likely",
            "are less likely",
        )
    ],
    *[("POSSIBLE_EXISTENCE", "BIDIRECTIONAL", s) for s in ("is favored over", "favored over", "are favored over")],
    # not a statement about this image: dropped
    *[
        ("HYPOTHETICAL", "FORWARD", s)
        for s in (
            "evaluate for",
            "evaluation for",
            "assess for",
            "assessment for",
            "to assess",
            "to evaluate",
            "to exclude",
            "rule out",
            "r/o",
            "if",
            "in case of",
            "recommend",
            "recommended",
            "follow-up for",
            "unless",
        )
    ],
    # scope ends
    *[
        ("TERMINATE", "TERMINATE", s)
        for s in (
            "but",
            "however",
            "although",
            "though",
            "which",
            "aside from",
            "apart from",
            "except",
            "with",
            ";",
            "while",
            "whereas",
            "as well as",
            "otherwise",
        )
    ],
)
"""Radiology ConText modifiers (a tuned set, not medspaCy's general clinical defaults, which
e.g. negate "evaluate for")."""

CONTEXT_MAX_SCOPE: dict[str, int] = {"unless": 8}
"""Modifiers whose scope ends after this many tokens (default: the sentence, or 6 tokens for a
bidirectional one): "Unless there is clinical information supporting pneumonia such as fever
and cough, I favor atelectasis." conditions the pneumonia, not the atelectasis."""

TENTATIVE_LINKS: tuple[str, ...] = (
    "likely",
    "probably",
    "possibly",
    "possible",
    "may",
    "could",
    "might",
    "suggest",
    "suggests",
    "suggesting",
    "suggestive",
    "concerning",
    "suspicious",
    "worrisome",
    "questionable",
    "presumably",
    "presumed",
    "versus",
    "vs",
    "favored",
    "favor",
    "exclude",
    "excluded",
    "suspected",
    "concern",
)
"""Words between an opacity and its predicted type that make the prediction tentative."""

TYPE_LINKS: tuple[str, ...] = (
    "reflect",
    "reflects",
    "reflecting",
    "represent",
    "represents",
    "representing",
    "related to",
    "due to",
    "secondary to",
    "consistent with",
    "compatible with",
    "suggest",
    "suggests",
    "suggesting",
    "suggestive of",
    "concerning for",
    "concerning",
    "worrisome for",
    "suspicious for",
    "likely",
    "probably",
    "possibly",
    "could be",
    "may be",
    "which may",
    "which could",
    "which is",
    "attributed to",
    "in keeping with",
    "characteristic of",
    "typical of",
    "indicating",
    "indicative of",
    "concern for",
    "favored to be",
    "favor",
    "may relate to",
    "most likely",
    "from",
    "c/w",
    "compatible",
    "consistent",
    "may",
    "could",
    "might",
    "either",
    "versus",
    "vs",
    "questionable for",
    "question of",
    "differential includes",
)
"""Phrases that tie a non-specific finding to a specific one ("opacity reflects pneumonia")."""

ALTERNATIVE_WORDS: tuple[str, ...] = ("or", "versus", "vs", "and/or", "/")
"""A word between two present findings that offers them as alternatives ("atelectasis or
pneumonia", "atelectasis versus pneumonia"): both are tentative, neither is definite."""

# --- hedging per finding ---------------------------------------------------------------------

HEDGE_GRADES: tuple[str, ...] = ("probable", "possible", "alternative")
"""How strongly a tentative mention is hedged, strongest first (what
:attr:`~monailabel_xflow.data.mimic_ils.ReportedFinding.hedge` holds): ``"probable"`` (the
radiologist's best reading, about 75 % in the certainty lexicon of Panicek & Hricak, AJR 2016),
``"possible"`` (about 50 % or less: "may", "possible", "cannot exclude", "less likely") and
``"alternative"`` (offered beside another finding: "atelectasis versus pneumonia", "atelectasis or
pneumonia", a differential). A mention with several hedges takes the weakest."""

PROBABLE_HEDGES: frozenset[str] = frozenset(
    {
        "probable",
        "probably",
        "likely",
        "most likely",
        "is likely",
        "are likely",
        "presumed",
        "presumably",
        "favor",
        "favored",
        "favoring",
        "would favor",
        "is favored",
        "are favored",
        "favored over",
        "is favored over",
        "are favored over",
        "favored to be",
        "suspicious for",
        "suspicious",
        "concerning for",
        "concerning",
        "concern for",
        "worrisome for",
        "worrisome",
        "suggestive of",
        "suggestive",
        "suggest",
        "suggests",
        "suggesting",
        "would be consistent with",
        "would be most consistent with",
        "suspected",
        "is suspected",
        "are suspected",
        "suspect",
    }
)
"""Hedge cues (ConText literals and link words) graded ``"probable"``: the MSK lexicon's
"probably / suspicious for" tier (Panicek & Hricak 2016); "likely" is not an uncertainty cue at
all for the CheXpert labeler (its uncertainty patterns name "possible", "probable", "suspicious",
"may", "versus", "cannot exclude", "less likely", but not "likely"), which we keep one step
weaker: tentative, graded probable. Every other tentative cue is ``"possible"``, except
:data:`ALTERNATIVE_HEDGES`."""

ALTERNATIVE_HEDGES: frozenset[str] = frozenset(
    {
        "versus",
        "vs",
        "either",
        "may represent either",
        "or",
        "and/or",
        "/",
        "differential includes",
        "differential diagnosis includes",
        "differential diagnosis would include",
        "differential considerations include",
        "differential considerations",
        "differential diagnosis",
        "differential",
        "with or without",
        "cannot be differentiated from",
        "cannot be distinguished from",
        "unsure whether",
        "uncertain whether",
        "unclear whether",
    }
)
"""Hedge cues that offer a finding as one of several (graded ``"alternative"``)."""

TENTATIVE_COUNTS_AS: dict[str, frozenset[str]] = {
    "atelectasis": frozenset({"probable"}),
    "effusion": frozenset({"probable"}),
    "pneumonia": frozenset(),
    "edema": frozenset(),
    "consolidation": frozenset(),
    "cardiomegaly": frozenset(),
    "opacity": frozenset(HEDGE_GRADES),
}
"""Per finding, the hedge grades under which a tentative mention still names the finding in a
report-level label (``report_eval.report_labels`` mode ``"per-finding"``); a tentative lung
finding outside its grades names only ``opacity`` (MIMIC-ILS §C.1), a tentative cardiomegaly or
effusion nothing. Why, finding by finding:

* **pneumonia**: no hedge counts. Pneumonia is a clinical diagnosis the radiograph can only
  support; a hedged or differential pneumonia is an opacity. CMC dev half, reports whose only
  pneumonia mention is tentative, coded / all: probable ("likely represents pneumonia",
  "suggestive of pneumonia") 1 / 9, possible 1 / 3, alternatives 3 / 9; the ICD-9-CM
  outpatient guideline codes no "probable / suspected / questionable" diagnosis.
* **edema**: no hedge counts (the CheXpert labeler marks "possible / may represent / cannot
  exclude edema" uncertain; hedged edema on a radiograph is mostly vascular congestion or a
  technique question). No CMC labels: a literature choice.
* **atelectasis** and **effusion**: a probable-grade hedge counts ("likely atelectasis", "probable
  small left effusion"). Both are descriptive radiographic signs, so the hedge is about the
  reader's confidence in what is seen, not about a diagnosis; the CheXpert labeler reads "likely"
  as positive, and the CheXpert authors found uncertain atelectasis best treated as positive
  (U-Ones, Irvin et al. 2019). "Possible" atelectasis and "atelectasis versus pneumonia" do not
  count: the CheXpert labeler marks both uncertain, and the CMC dev half codes them 1 time in 10
  (probable atelectasis: 1 in 4; too few to decide on, so the literature decides).
* **consolidation**, **cardiomegaly**: no hedge counts ("borderline heart size" is not
  cardiomegaly; a hedged consolidation is an opacity).
* **opacity**: every grade (a hedged "questionable opacity" is still a reported opacity under
  MIMIC-ILS §C.1).
"""

PREDICTED_TYPES: dict[str, tuple[str, ...]] = {
    "opacity": ("pneumonia", "atelectasis", "edema", "consolidation", "effusion"),
    "consolidation": ("pneumonia", "atelectasis", "edema"),
}
"""Which findings a non-specific finding may be predicted to be."""

# --- sections (Sectionizer) --------------------------------------------------------------------

SECTION_HEADERS: dict[str, tuple[str, ...]] = {
    "findings": ("findings", "finding", "findings and impression", "findings/impression", "report"),
    "impression": ("impression", "impressions", "conclusion", "conclusions", "summary", "opinion"),
    "other": (
        "indication",
        "indications",
        "history",
        "clinical history",
        "clinical information",
        "reason for exam",
        "reason for examination",
        "comparison",
        "comparisons",
        "technique",
        "examination",
        "exam",
        "procedure",
        "notification",
        "recommendation",
        "recommendations",
        "wet read",
        "final report",
        "addendum",
        "clinical indication",
        "type of examination",
        "study",
        "views",
    ),
}
"""Header words (before a colon) of each section kind; anything else is body text."""

# --- locations -------------------------------------------------------------------------------

SIDE_WORDS: dict[str, tuple[str, ...]] = {
    "right": ("right",),
    "left": ("left",),
    "bilateral": ("right", "left"),
    "bilaterally": ("right", "left"),
    "both": ("right", "left"),
    "bibasilar": ("right", "left"),
    "bibasal": ("right", "left"),
    "bibasally": ("right", "left"),
    "biapical": ("right", "left"),
    "bilat": ("right", "left"),
}

ZONE_PARTS: dict[str, int] = {
    "apex": 0,
    "apices": 0,
    "apical": 0,
    "apically": 0,
    "biapical": 0,
    "upper": 1,
    "mid": 2,
    "middle": 2,
    "midlung": 2,
    "mid-lung": 2,
    "lower": 3,
    "base": 3,
    "bases": 3,
    "basilar": 3,
    "basal": 3,
    "basally": 3,
    "bibasilar": 3,
    "bibasal": 3,
    "bibasally": 3,
    "infrahilar": 3,
}
"""Part words -> zone index (apical, upper, mid, base) within a lung; a following "lobe" makes
upper / middle / lower a lobe instead."""

LOBE_OF: dict[tuple[str, int], str] = {
    ("right", 1): "right upper lobe",
    ("right", 0): "right upper lobe",
    ("right", 2): "right middle lobe",
    ("right", 3): "right lower lobe",
    ("left", 1): "left upper lobe",
    ("left", 0): "left upper lobe",
    ("left", 2): "left upper lobe",
    ("left", 3): "left lower lobe",
}
"""(side, part) -> lobe; the left lung has no middle lobe (its lingula is in the upper lobe)."""
assert set(LOBE_OF.values()) == set(LUNG_LOBES)

ZONE_OF: dict[tuple[str, int], str] = {
    (side, k): ZONES[f"{side} lung"][k] for side in ("right", "left") for k in range(4)
}

LUNG_NOUNS: tuple[str, ...] = (
    "lung",
    "lungs",
    "lobe",
    "lobes",
    "zone",
    "zones",
    "field",
    "fields",
    "hemithorax",
    "hemithoraces",
    "lingula",
    "lingular",
    "retrocardiac",
    "costophrenic",
    "perihilar",
    "hilar",
    "hilum",
    "hila",
    "parenchyma",
    "parenchymal",
    "lobar",
)
"""Words that make a location phrase a lung location even beside another category word."""

CATEGORY_WORDS: dict[str, str] = {
    # heart
    "heart": "heart",
    "cardiac": "heart",
    "pericardial": "heart",
    "cardio": "heart",
    # mediastinum
    "mediastinum": "mediastinum",
    "mediastinal": "mediastinum",
    "paratracheal": "mediastinum",
    "hiatal": "mediastinum",
    "cardiomediastinal": "mediastinum",
    "subcarinal": "mediastinum",
    # vessels
    "aorta": "vessels",
    "aortic": "vessels",
    "vascular": "vessels",
    "vasculature": "vessels",
    "vessel": "vessels",
    "vessels": "vessels",
    "svc": "vessels",
    "ivc": "vessels",
    "azygos": "vessels",
    "arterial": "vessels",
    "venous": "vessels",
    "artery": "vessels",
    "arteries": "vessels",
    # trachea
    "trachea": "trachea",
    "tracheal": "trachea",
    "carina": "trachea",
    "endobronchial": "trachea",
    # diaphragm
    "diaphragm": "diaphragm",
    "hemidiaphragm": "diaphragm",
    "hemidiaphragms": "diaphragm",
    "diaphragmatic": "diaphragm",
    "diaphragms": "diaphragm",
    # pleura
    "pleura": "pleura",
    "pleural": "pleura",
    "fissure": "pleura",
    "fissural": "pleura",
    "fissures": "pleura",
    # bones
    "rib": "rib",
    "ribs": "rib",
    "costal": "rib",
    "clavicle": "clavicle",
    "clavicles": "clavicle",
    "clavicular": "clavicle",
    "acromioclavicular": "clavicle",
    "scapula": "scapula",
    "scapulae": "scapula",
    "scapular": "scapula",
    "sternum": "sternum",
    "sternal": "sternum",
    "manubrium": "sternum",
    "spine": "thoracic spine",
    "spinal": "thoracic spine",
    "vertebral": "thoracic spine",
    "vertebra": "thoracic spine",
    "vertebrae": "thoracic spine",
    "thoracolumbar": "thoracic spine",
    "paraspinal": "thoracic spine",
    # abdomen
    "abdomen": "abdomen",
    "abdominal": "abdomen",
    "subdiaphragmatic": "abdomen",
    "gastric": "abdomen",
    "stomach": "abdomen",
    "bowel": "abdomen",
    "colon": "abdomen",
    "hepatic": "abdomen",
    "liver": "abdomen",
    "splenic": "abdomen",
    "spleen": "abdomen",
    "peritoneal": "abdomen",
    # breast
    "breast": "breast",
    "breasts": "breast",
    "nipple": "breast",
    "mastectomy": "breast",
    # lateral view only
    "retrosternal": "lateral view location",
}
"""Single words -> one of the 17 location categories (other than lung)."""

CATEGORY_PHRASES: dict[str, str] = {
    "cervical spine": "cervical spine",
    "lumbar spine": "lumbar spine",
    "thoracic spine": "thoracic spine",
    "upper abdomen": "abdomen",
    "posterior costophrenic": "lateral view location",
    "posterior sulcus": "lateral view location",
    "posterior sulci": "lateral view location",
    "lateral view": "lateral view location",
    "lateral radiograph": "lateral view location",
    "lateral projection": "lateral view location",
    "lateral image": "lateral view location",
}
"""Multi-word phrases checked before the single words (so "cervical spine" is not thoracic)."""

SIDELESS_LUNG: tuple[str, ...] = ("lung", "pulmonary", "parenchyma", "parenchymal")
"""Whole-lung words that, without a side, give the category ``lung``."""

LOCATION_CONNECTORS: tuple[str, ...] = (
    "and",
    "or",
    ",",
    "the",
    "of",
    "-",
    "/",
    "to",
    "both",
    "sided",
    "greater",
    "than",
    "more",
    "worse",
    "larger",
    "medial",
    "lateral",
    "medially",
    "laterally",
)
"""Tokens allowed inside one location phrase ("right upper and left lower lobes", "right greater
than left", "medial left base")."""

LOCATION_PREPOSITIONS: tuple[str, ...] = (
    "in",
    "at",
    "on",
    "within",
    "of",
    "involving",
    "along",
    "over",
    "overlying",
    "throughout",
    "near",
    "adjacent",
    "projecting",
    "into",
    "from",
    "to",
    "affecting",
    "about",
    "in the",
    "by",
)
"""Words that tie a location phrase after a finding to it ("opacity in the right base")."""

FINDING_MODIFIERS: tuple[str, ...] = (
    "a",
    "an",
    "the",
    "small",
    "moderate",
    "large",
    "mild",
    "minimal",
    "trace",
    "tiny",
    "severe",
    "massive",
    "new",
    "newly",
    "increased",
    "increasing",
    "decreased",
    "decreasing",
    "worsening",
    "worsened",
    "improving",
    "improved",
    "persistent",
    "stable",
    "unchanged",
    "residual",
    "patchy",
    "streaky",
    "linear",
    "plate-like",
    "platelike",
    "subsegmental",
    "segmental",
    "discoid",
    "focal",
    "multifocal",
    "diffuse",
    "hazy",
    "ill-defined",
    "confluent",
    "nodular",
    "reticular",
    "interstitial",
    "layering",
    "loculated",
    "mildly",
    "moderately",
    "minimally",
    "slightly",
    "markedly",
    "small-to-moderate",
    "moderate-to-large",
    "-",
    "to",
    "sided",
    "probable",
    "possible",
    "likely",
    "early",
    "developing",
    "vague",
    "faint",
    "subtle",
    "dense",
    "bandlike",
    "band-like",
    "compressive",
    "relaxation",
    "some",
    "additional",
    "apparent",
    "slight",
    "borderline",
    "calcified",
    "upper",
    "lower",
    "mid",
    "middle",
    "lobe",
    "lobar",
    "moderate-sized",
    "small-sized",
    "large-sized",
    "coarse",
    "prominent",
    "overall",
    "generalized",
    "scattered",
    "bulky",
    "airspace",
)
"""Words that may stand between a location word and the finding it describes
("right *small* effusion", "left *lower lobe* atelectasis")."""
