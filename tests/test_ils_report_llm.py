"""The optional LLM report structurer: JSON validation, retries, and the transformers path with a
tiny random model and a scripted one (no downloads)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("medspacy", reason="medspaCy is not installed here: run `make setup`")

from monailabel_xflow.data.mimic_ils import ReportedFinding  # noqa: E402
from monailabel_xflow.ils.report import ReportStructuringError, structure_report
from monailabel_xflow.ils.report_llm import (  # noqa: E402
    LLMStructurer,
    build_prompt,
    load_llm_structurer,
    parse_answer,
    structurer_from_name,  # noqa: E402
)

SECTION = "Right lower lobe opacity likely reflects pneumonia. No pneumothorax. Stable bibasilar atelectasis."
ANSWER = [
    {
        "entity": "opacity",
        "sentence": 1,
        "presence": "positive",
        "certainty": "tentative",
        "location": ["right lower lobe"],
        "predicted_type": "pneumonia",
    },
    {
        "entity": "pneumothorax",
        "sentence": 2,
        "presence": "negative",
        "certainty": "definitive",
        "location": [],
        "predicted_type": None,
    },
    {
        "entity": "atelectasis",
        "sentence": 3,
        "presence": "positive",
        "certainty": "definitive",
        "location": ["bibasilar"],
        "predicted_type": None,
    },
]
EXPECTED = [
    ReportedFinding("opacity", 1, True, True, ("right lower lobe",), "pneumonia"),
    ReportedFinding("pneumothorax", 2, False, False, (), None),
    ReportedFinding("atelectasis", 3, True, False, ("right lung base", "left lung base"), "atelectasis"),
]


def test_scripted_answer_mapped_like_the_rules():
    prompts = []

    def generate(prompt):
        prompts.append(prompt)
        return "Here you go:\n```json\n" + json.dumps(ANSWER) + "\n```"

    got = LLMStructurer(generate)(SECTION)
    assert got == EXPECTED
    assert "1. Right lower lobe opacity likely reflects pneumonia.\n2. No pneumothorax." in prompts[0]
    # the rule-based structurer reads the same section the same way
    assert structure_report("FINDINGS: " + SECTION) == EXPECTED


@pytest.mark.parametrize(
    "answer, message",
    [
        ("I cannot help with that.", "no JSON array"),
        ('[{"entity": "effusion",]', "not valid JSON"),
        (json.dumps([{**ANSWER[0], "presence": "maybe"}]), "schema at 0/presence"),
        (json.dumps([{k: v for k, v in ANSWER[0].items() if k != "location"}]), "'location' is a required"),
        (json.dumps([{**ANSWER[0], "sentence": 9}]), "sentence 9 is out of range"),
    ],
)
def test_invalid_answers_rejected(answer, message):
    with pytest.raises(ReportStructuringError, match=message):
        parse_answer(answer, 3)


def test_retry_tells_the_model_what_was_wrong():
    answers = iter(["not json", json.dumps(ANSWER)])
    prompts = []

    def generate(prompt):
        prompts.append(prompt)
        return next(answers)

    assert LLMStructurer(generate, retries=1)(SECTION) == EXPECTED
    assert "rejected" in prompts[1] and "no JSON array" in prompts[1]
    with pytest.raises(ReportStructuringError, match="after 1 attempt"):
        LLMStructurer(lambda p: "nope", retries=0)(SECTION)
    assert LLMStructurer(lambda p: "[]")("   ") == []


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """A tiny random Gemma3 text model and the project's offline tokenizer, saved in HF format."""
    from transformers import AutoTokenizer

    from monailabel_xflow.ils.report_llm import save_random_llm

    folder = save_random_llm(tmp_path_factory.mktemp("tiny_lm"))
    return folder, AutoTokenizer.from_pretrained(folder, local_files_only=True)


def test_tiny_random_model_runs_and_is_rejected(tiny_lm):
    folder, _ = tiny_lm
    structurer = load_llm_structurer(str(folder), max_new_tokens=12, retries=1)
    with pytest.raises(ReportStructuringError, match="2 attempt"):
        structurer(SECTION)
    via_name = structurer_from_name("llm", model=str(folder), max_new_tokens=4, retries=0)
    with pytest.raises(ReportStructuringError):
        via_name(SECTION)


def test_scripted_model_through_generate(tiny_lm):
    import torch

    _, tok = tiny_lm
    reply = tok(json.dumps(ANSWER) + "<eos>", add_special_tokens=False, return_tensors="pt")["input_ids"]

    class ScriptedLM:
        """Answers every prompt with the same token ids, as ``generate`` does: prompt + reply."""

        device = torch.device("cpu")
        seen: list[str] = []

        def generate(self, input_ids, attention_mask=None, max_new_tokens=0, **kwargs):
            self.seen.append(tok.decode(input_ids[0]))
            assert kwargs["do_sample"] is False and max_new_tokens == 256
            return torch.cat([input_ids, reply], dim=1)

    lm = ScriptedLM()
    got = LLMStructurer.from_model(lm, tok, max_new_tokens=256)(SECTION)
    assert got == EXPECTED
    assert lm.seen[0].startswith("<bos><start_of_turn>user\n") and "3. Stable bibasilar atelectasis." in lm.seen[0]


def test_never_downloads():
    with pytest.raises(FileNotFoundError, match="allow_download"):
        load_llm_structurer("no-such-org/no-such-model")
    with pytest.raises(ValueError, match="rules, llm"):
        structurer_from_name("crystal-ball")


def test_prompt_numbers_sentences():
    assert build_prompt(["A.", "B."]).endswith("Sentences:\n1. A.\n2. B.")


def test_xflow_ils_build_runs_the_llm_structurer(tiny_lm, tmp_path, capsys):
    """`--structurer llm` loads the local model and structures every report with it: the random
    model's answers fail validation, so each study is skipped with the reason, and nothing runs."""
    from monailabel_xflow.cli import main
    from monailabel_xflow.data.export import export_set

    folder, _ = tiny_lm
    export_set(tmp_path / "ph", 2, seed=3, size=128)
    args = [
        "ils",
        "build",
        "--images",
        str(tmp_path / "ph"),
        "--reports",
        str(tmp_path / "ph" / "reports.csv"),
        "--out",
        str(tmp_path / "out"),
        "--structurer",
        "llm",
    ]
    assert main(args + ["--llm-model", str(tmp_path / "no-such-model")]) == 2
    assert "cannot read the reports" in capsys.readouterr().err
    assert main(args + ["--llm-model", str(folder), "--llm-max-new-tokens", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("the report could not be structured") == 2 and "no study to process" in err
