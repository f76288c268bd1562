"""``xflow weights merge``: the policies' adapters merged into two plain models that answer as the
adapters do, in a models file that serves them, without ever overwriting a folder."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from monailabel_xflow.cli import main
from monailabel_xflow.policy.base import PolicyError
from monailabel_xflow.policy.merging import MERGE_RECORD, merge_adapter, stored_dtype
from monailabel_xflow.workflow.model_config import DEMO_DIR, ModelConfig

README_IMAGE = DEMO_DIR.parents[1] / "sample-data" / "phantom_1_00006.png"
README_INSTRUCTION = "Segment the effusion in the left lung."


@pytest.fixture(autouse=True)
def no_model_env(monkeypatch):
    for name in ("XFLOW_MODELS", "XFLOW_VLM_BASE", "XFLOW_INIT_MODEL", "XFLOW_SEGMENTER"):
        monkeypatch.delenv(name, raising=False)


def _segment(models, out) -> dict:
    """The README's example through ``xflow segment``: the trace without timings or model names."""
    args = ["segment", str(README_IMAGE), "-i", README_INSTRUCTION, "--out", str(out), "--models", str(models)]
    assert main(args) == 0
    trace = json.loads((out / "trace.json").read_text())

    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in {"created", "models", "timings", "seconds"}}
        return [strip(v) for v in node] if isinstance(node, list) else node

    return strip(trace)


def test_merged_demo_answers_as_its_adapters_do(tmp_path, capsys):
    # the demo's models file, biased so that π_rev clicks (on this image it stops as trained)
    demo = yaml.safe_load((DEMO_DIR / "models.yaml").read_text())
    demo.update({k: str(DEMO_DIR / demo[k]) for k in ("vlm_base", "init_adapter", "rev_adapter", "segmenter")})
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({**demo, "stage2_stop_bias": -5.0}))
    out = tmp_path / "merged"
    assert main(["weights", "merge", "--models", str(models), "--out", str(out)]) == 0
    assert "xflow serve --studies DIR --models" in capsys.readouterr().out
    written = yaml.safe_load((out / "models.yaml").read_text())
    source = ModelConfig.from_file(models)
    assert written["init_model"] == "./init" and written["rev_model"] == "./rev"
    assert not {"vlm_base", "init_adapter", "rev_adapter"} & set(written)
    assert written["segmenter"] == str(source.resolve("segmenter"))  # absolute: the file moved
    for setting in ("click_refinement", "stage1_presence_bias", "stage2_stop_bias", "max_new_tokens", "device"):
        assert written[setting] == getattr(source, setting)
    for folder in ("init", "rev"):
        record = json.loads((out / folder / MERGE_RECORD).read_text())
        assert record["adapter"] == str(DEMO_DIR / folder) and record["dtype"] == "float32"
        assert stored_dtype(out / folder) == "float32"

    adapters, merged = _segment(models, tmp_path / "a"), _segment(out / "models.yaml", tmp_path / "b")
    lesions = merged["lesions"]
    assert lesions and any(step["action"] == "click" for lesion in lesions for step in lesion["steps"])  # π_rev ran
    assert merged == adapters  # Stage 1's text, every Stage 2 turn, every mask
    assert (tmp_path / "a" / "mask.png").read_bytes() == (tmp_path / "b" / "mask.png").read_bytes()


def test_a_merged_adapter_gives_the_adapters_logits_and_is_cast_once(tiny_vlm, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    ids = torch.randint(3, 200, (1, 12), generator=torch.Generator().manual_seed(0))
    base = AutoModelForImageTextToText.from_pretrained(str(tiny_vlm.base), dtype=torch.float32).eval()
    with torch.no_grad():
        plain = base(input_ids=ids).logits
        wrapped = PeftModel.from_pretrained(base, str(tiny_vlm.init)).eval()
        expected = wrapped(input_ids=ids).logits
    assert (expected - plain).abs().max() > 1e-3  # the adapter changes the answer: the check can fail

    out = merge_adapter(tiny_vlm.base, tiny_vlm.init, tmp_path / "init")
    merged = AutoModelForImageTextToText.from_pretrained(str(out)).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-4, rtol=1e-4)

    half = merge_adapter(tiny_vlm.base, tiny_vlm.init, tmp_path / "half", dtype="bfloat16")
    assert stored_dtype(half) == "bfloat16"
    loaded = AutoModelForImageTextToText.from_pretrained(str(half))
    cast_once = {k: v.to(torch.bfloat16) for k, v in merged.state_dict().items()}
    for name, tensor in loaded.state_dict().items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, cast_once[name]), name


def test_merge_never_overwrites_and_says_what_is_wrong(tiny_models, tiny_vlm, tmp_path, capsys):
    config = tiny_models(tmp_path / "cfg")
    config.write_text("vlm_base: vlm/base\ninit_adapter: vlm/init\nrev_adapter: vlm/rev\nsegmenter: sam3\n")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "note.txt").write_text("mine")
    assert main(["weights", "merge", "--models", str(config), "--out", str(kept)]) == 2
    assert "never overwrites" in capsys.readouterr().err and (kept / "note.txt").read_text() == "mine"
    with pytest.raises(PolicyError, match="never overwrites"):
        merge_adapter(tiny_vlm.base, tiny_vlm.init, kept)

    merged = tmp_path / "merged.yaml"
    merged.write_text(f"init_model: {tiny_vlm.base}\nsegmenter: {config.parent / 'sam3'}\n")
    assert main(["weights", "merge", "--models", str(merged), "--out", str(tmp_path / "m")]) == 2
    assert "already names merged models" in capsys.readouterr().err

    missing = tmp_path / "missing.yaml"
    missing.write_text(f"vlm_base: {tiny_vlm.base}\ninit_adapter: ./nowhere\nsegmenter: {config.parent / 'sam3'}\n")
    assert main(["weights", "merge", "--models", str(missing), "--out", str(tmp_path / "n")]) == 2
    assert "nowhere" in capsys.readouterr().err and not (tmp_path / "n").exists()

    stage1 = tmp_path / "stage1.yaml"
    stage1.write_text(f"vlm_base: {tiny_vlm.base}\ninit_adapter: {tiny_vlm.init}\nsegmenter: hf-org/sam3-tracker\n")
    out = tmp_path / "s1"
    assert main(["weights", "merge", "--models", str(stage1), "--out", str(out)]) == 0
    written = yaml.safe_load((out / "models.yaml").read_text())
    assert written == {"init_model": "./init", "segmenter": "hf-org/sam3-tracker"}  # a hub id stays one
    assert sorted(p.name for p in out.iterdir()) == ["init", "models.yaml"]
    loaded = ModelConfig.from_file(out / "models.yaml")
    assert loaded.resolve("init_model") == (out / "init").resolve() and not loaded.has_reviser


def test_merge_reads_the_environment_when_no_models_file_is_given(tiny_vlm, tmp_path, monkeypatch):
    # `--models` is optional, as for `show` and `pull`: the XFLOW_* variables name the weights
    monkeypatch.setenv("XFLOW_VLM_BASE", str(tiny_vlm.base))
    monkeypatch.setenv("XFLOW_INIT_ADAPTER", str(tiny_vlm.init))
    monkeypatch.setenv("XFLOW_SEGMENTER", "hf-org/sam3-tracker")
    out = tmp_path / "env"
    assert main(["weights", "merge", "--out", str(out)]) == 0
    assert json.loads((out / "init" / MERGE_RECORD).read_text())["adapter"] == str(tiny_vlm.init)
