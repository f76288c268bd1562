"""Optional report structurer: a local instruction-tuned LLM answering in validated JSON.

The MIMIC-ILS paper structures reports with Mistral-Small-3.1-24B-Instruct and maps locations
with medgemma-27b-text-it, both run locally (the data may not leave the hospital). Here the LLM
does step 1 (the 6-tuples, prompt after the paper's Figure 9 rules); its location strings and
entities then go through the same rule-based mapping as the default structurer
(:func:`~monailabel_xflow.ils.report.map_location`, :func:`~monailabel_xflow.ils.report.finding_of`),
so both structurers emit the same labels.

The answer must be a JSON array matching :data:`TUPLE_SCHEMA` (checked with ``jsonschema``) with
sentence indices inside the section; otherwise the structurer asks again (``retries`` times,
telling the model what was wrong) and then raises
:class:`~monailabel_xflow.ils.report.ReportStructuringError` naming the problem. Nothing is
downloaded unless the caller passes ``allow_download=True``: :func:`load_llm_structurer` reads a
local folder (or the Hugging Face cache) by default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from monailabel_xflow.data.mimic_ils import ReportedFinding
from monailabel_xflow.ils.report import default_structurer

TUPLE_SCHEMA: dict = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "array",
    "items": {
        "type": "object",
        "required": ["entity", "sentence", "presence", "certainty", "location", "predicted_type"],
        "additionalProperties": False,
        "properties": {
            "entity": {"type": "string", "minLength": 1},
            "sentence": {"type": "integer", "minimum": 1},
            "presence": {"enum": ["positive", "negative"]},
            "certainty": {"enum": ["definitive", "tentative"]},
            "location": {"type": "array", "items": {"type": "string"}},
            "predicted_type": {"type": ["string", "null"]},
        },
    },
}
"""The JSON an LLM must answer with: one object per finding."""

PROMPT = """You structure chest radiograph reports. For every disease or finding in the numbered \
sentences below, output one JSON object with:
- "entity": the finding name, with anatomy words moved to "location" ("hilar adenopathy" -> "adenopathy");
- "sentence": the number of the sentence it is in;
- "presence": "positive" if present or stable ("No change in pneumothorax" is positive), "negative" \
if absent or resolved ("Pneumothorax has resolved" is negative);
- "certainty": "tentative" for hedged statements ("possible", "suggests", "cannot exclude"), else "definitive";
- "location": the anatomical location words as written, a list (empty if none);
- "predicted_type": the specific disease a non-specific finding is said to be ("opacity reflects \
pneumonia" -> "pneumonia"), else null.
Ignore medical devices (tubes, lines, pacemakers). Do not extract general statements such as \
"clear", "unremarkable" or "normal". Answer with a JSON array only, [] if there is no finding.

Sentences:
{sentences}"""


def build_prompt(sentences: list[str]) -> str:
    """The structuring prompt for a section's sentences (numbered from 1)."""
    return PROMPT.format(sentences="\n".join(f"{i}. {s}" for i, s in enumerate(sentences, 1)))


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def parse_answer(text: str, n_sentences: int) -> list[ReportedFinding]:
    """Validate an LLM answer and map it to tuples.

    Args:
        text: the generated text; a code fence around the JSON and text before the first ``[``
            are tolerated.
        n_sentences: number of sentences in the section (indices must lie in ``1..n``).

    Raises:
        ReportStructuringError: no JSON array, invalid JSON, a schema violation or a sentence
            index out of range; the message says which.
    """
    import jsonschema

    from monailabel_xflow.ils.report import ReportStructuringError, finding_of, map_location

    fenced = _FENCE.search(text)
    body = fenced.group(1) if fenced else text
    start, end = body.find("["), body.rfind("]")
    if start < 0 or end < start:
        raise ReportStructuringError(f"the answer holds no JSON array: {text[:200]!r}")
    try:
        items = json.loads(body[start : end + 1])
    except json.JSONDecodeError as e:
        raise ReportStructuringError(f"the answer is not valid JSON ({e.msg} at {e.pos}): {text[:200]!r}") from None
    errors = sorted(jsonschema.Draft7Validator(TUPLE_SCHEMA).iter_errors(items), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "top level"
        raise ReportStructuringError(f"the answer does not match the schema at {where}: {first.message}")
    out = []
    for item in items:
        if item["sentence"] > n_sentences:
            raise ReportStructuringError(
                f"sentence {item['sentence']} is out of range: the section has {n_sentences} sentence(s)"
            )
        locations = tuple(dict.fromkeys(lab for loc in item["location"] for lab in map_location(loc)))
        predicted = finding_of(item["predicted_type"]) if item["predicted_type"] else None
        out.append(
            ReportedFinding(
                item["entity"],
                item["sentence"],
                item["presence"] == "positive",
                item["certainty"] == "tentative",
                locations,
                predicted or finding_of(item["entity"]),
            )
        )
    return out


class LLMStructurer:
    """Structure a section by asking an LLM (see the module docstring).

    Args:
        generate: prompt -> generated text (e.g. :meth:`from_model`'s greedy decoding).
        retries: extra attempts after an invalid answer; each repeats the prompt with the
            problem appended.
    """

    def __init__(self, generate: Callable[[str], str], retries: int = 1):
        self.generate = generate
        self.retries = retries

    def __call__(self, section: str) -> list[ReportedFinding]:
        from monailabel_xflow.ils.report import ReportStructuringError, split_sentences

        sentences = split_sentences(section)
        if not sentences:
            return []
        prompt = build_prompt(sentences)
        error: ReportStructuringError | None = None
        for _ in range(self.retries + 1):
            asked = (
                prompt
                if error is None
                else f"{prompt}\n\nYour previous answer was rejected: {error}. Answer with a JSON array only."
            )
            try:
                return parse_answer(self.generate(asked), len(sentences))
            except ReportStructuringError as e:
                error = e
        raise ReportStructuringError(f"no valid answer after {self.retries + 1} attempt(s); last: {error}")

    @classmethod
    def from_model(cls, model, tokenizer, max_new_tokens: int = 512, retries: int = 1) -> LLMStructurer:
        """Wrap a ``transformers`` causal LM and its tokenizer (greedy decoding).

        The prompt goes through the tokenizer's chat template when it has one (a user turn, then
        the generation prompt), else as plain text.
        """
        import torch

        def generate(prompt: str) -> str:
            if getattr(tokenizer, "chat_template", None):
                text = tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
                )
                enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
            else:
                enc = tokenizer(prompt, return_tensors="pt")
            device = getattr(model, "device", None)
            if device is not None:
                enc = {k: v.to(device) for k, v in enc.items()}
            with torch.no_grad():
                out = model.generate(
                    **enc,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                )
            return tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)

        return cls(generate, retries=retries)


def load_llm_structurer(
    model: str,
    allow_download: bool = False,
    device: str = "cpu",
    dtype: str | None = None,
    max_new_tokens: int = 512,
    retries: int = 1,
) -> LLMStructurer:
    """An :class:`LLMStructurer` over a local instruction-tuned causal LM.

    Args:
        model: a local folder in Hugging Face format, or a hub id already in the local cache.
        allow_download: fetch ``model`` from the hub if it is not local (never done otherwise).
        device: torch device string.
        dtype: e.g. ``"bfloat16"``; default the checkpoint's.

    Raises:
        FileNotFoundError: ``model`` is neither a local folder nor cached, and downloads are off.
    """
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = not allow_download
    try:
        tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=local)
        kwargs = {"dtype": dtype} if dtype else {}
        lm = AutoModelForCausalLM.from_pretrained(model, local_files_only=local, **kwargs)
        # transformers wraps PreTrainedModel.to with functools.wraps(nn.Module.to): the stubs lose the bound self
        lm = lm.to(device).eval()  # type: ignore[arg-type]
    except OSError as e:
        if local and not Path(model).is_dir():
            raise FileNotFoundError(
                f"LLM structurer model {model!r} is not a local folder nor in the Hugging Face cache; "
                "pass a local path, or allow_download=True to fetch it"
            ) from e
        raise
    return LLMStructurer.from_model(lm, tokenizer, max_new_tokens=max_new_tokens, retries=retries)


def save_random_llm(folder, seed: int = 0):
    """Save a tiny random Gemma3 text model (the ``tiny`` text size of
    :mod:`~monailabel_xflow.policy.configs`) and the offline tokenizer to ``folder``, in Hugging
    Face format: what tests and benchmarks load through :func:`load_llm_structurer` in place of a
    real instruction-tuned model. Returns ``folder``."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from monailabel_xflow.policy.configs import SIZES, build_tokenizer

    tok = build_tokenizer()
    cfg = Gemma3TextConfig(
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **SIZES["tiny"]["text"],
    )
    torch.manual_seed(seed)
    Gemma3ForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def structurer_from_name(name: str, **kwargs) -> Callable[[str], list[ReportedFinding]]:
    """``"rules"`` (default) or ``"llm"`` (``model=`` a local folder or hub id; see
    :func:`~monailabel_xflow.ils.report_llm.load_llm_structurer`)."""
    if name == "rules":
        return default_structurer()
    if name == "llm":
        from monailabel_xflow.ils.report_llm import load_llm_structurer

        return load_llm_structurer(**kwargs)
    raise ValueError(f"unknown structurer {name!r}; supported: rules, llm")
