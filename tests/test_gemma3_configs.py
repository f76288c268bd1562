"""The offline tokenizer/processor and the random Gemma3 builder (policy/configs.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monailabel_xflow.geometry import Click
from monailabel_xflow.policy.configs import (
    PROTOCOL_TAGS,
    SIZES,
    SPECIAL_TOKENS,
    build_processor,
    build_random_vlm,
    build_tokenizer,
    gemma3_config,
)
from monailabel_xflow.policy.protocol import BoxRef, Stage1Output, Stage2Action, format_stage1, format_stage2


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_digits_are_single_tokens(tok):
    for d in "0123456789":
        assert len(tok.encode(d, add_special_tokens=False)) == 1
    text = "(123,456),(1000,7)"
    pieces = tok.tokenize(text)
    assert "".join(pieces) == text
    digits = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digits == list("12345610007")  # punctuation may merge ("),("), digits never do


def test_prompt_words_are_whole_tokens(tok):
    """Trained on the prompts, the tokenizer splits them about as Gemma's does (a word a token)."""
    from monailabel_xflow.policy.prompts import STAGE2_FOLLOWUP

    assert len(tok.tokenize(STAGE2_FOLLOWUP)) <= len(STAGE2_FOLLOWUP.split()) + 4


@pytest.mark.parametrize("tag", PROTOCOL_TAGS + SPECIAL_TOKENS)
def test_tags_and_special_tokens_are_single_tokens(tok, tag):
    ids = tok.encode(f"x{tag}y", add_special_tokens=False)
    assert tok.convert_tokens_to_ids(tag) in ids
    assert len(tok.encode(tag, add_special_tokens=False)) == 1


def test_gemma_ids_and_attributes(tok):
    assert [tok.convert_tokens_to_ids(t) for t in ("<pad>", "<eos>", "<bos>", "<unk>")] == [0, 1, 2, 3]
    assert (tok.pad_token, tok.eos_token, tok.bos_token) == ("<pad>", "<eos>", "<bos>")
    assert tok.boi_token == "<start_of_image>" and tok.image_token == "<image_soft_token>"
    # Nothing is added silently: the chat template writes <bos> itself.
    assert tok.encode("left lung") == tok.encode("left lung", add_special_tokens=False)


def test_protocol_text_round_trips_through_decode(tok):
    """Policies return decode(skip_special_tokens=True): tags must survive, specials must not."""
    s1 = format_stage1(
        Stage1Output(
            lungs=[BoxRef("right lung", (0.1, 0.2, 0.45, 0.9)), BoxRef("left lung", (0.55, 0.2, 0.9, 0.88))],
            present=True,
            lesions=[BoxRef("effusion", (0.6, 0.7, 0.9, 0.88))],
            think="fluid at the base",
        )
    )
    s2 = format_stage2(Stage2Action(Click(False, 0.5, 0.25), "too big"))
    for text in (s1, s2, format_stage2(Stage2Action(None))):
        ids = tok.encode(text + "<end_of_turn>", add_special_tokens=False)
        assert tok.decode(ids, skip_special_tokens=True) == text


def test_chat_template_renders_gemma_turns():
    proc = build_processor("tiny")
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Hi "}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<bos><start_of_turn>user\n<start_of_image>Hi<end_of_turn>\n<start_of_turn>model\n"
    from PIL import Image

    enc = proc(text=text, images=[Image.new("RGB", (40, 30))], return_tensors="pt", add_special_tokens=False)
    n_soft = int((enc["input_ids"] == proc.tokenizer.image_token_id).sum())
    assert n_soft == SIZES["tiny"]["mm_tokens_per_image"] == int(enc["token_type_ids"].sum())
    assert tuple(enc["pixel_values"].shape) == (1, 3, SIZES["tiny"]["image_size"], SIZES["tiny"]["image_size"])


def test_unknown_size_is_refused():
    with pytest.raises(ValueError, match="unknown model size"):
        gemma3_config("huge")


def test_mid_config_has_hundreds_of_millions_of_parameters():
    import torch
    from transformers import Gemma3ForConditionalGeneration

    with torch.device("meta"):
        model = Gemma3ForConditionalGeneration(gemma3_config("mid"))
    n = sum(p.numel() for p in model.parameters())
    assert 1e8 < n < 1e9, n
    # Gemma 3's layer pattern: five sliding-window layers, then one full-attention layer
    pattern = ["sliding_attention"] * 5 + ["full_attention"]
    assert gemma3_config("mid").get_text_config().layer_types == pattern * 2


def test_medgemma_4b_size_has_the_real_model_shapes():
    """4.3 B parameters, the real vocabulary's output layer, 256 image tokens from 896 px."""
    import torch
    from transformers import Gemma3ForConditionalGeneration

    config = gemma3_config("medgemma-4b")
    with torch.device("meta"):
        model = Gemma3ForConditionalGeneration(config)
    n = sum(p.numel() for p in model.parameters())
    assert 4.2e9 < n < 4.4e9, n
    text = config.get_text_config()
    assert text.vocab_size == 262_208 and text.layer_types.count("full_attention") == 5
    image = build_processor("medgemma-4b").image_processor
    assert image.size == {"height": 896, "width": 896} and config.mm_tokens_per_image == 256


def test_a_model_built_in_bfloat16_is_saved_and_loaded_in_bfloat16(tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText

    vlm = build_random_vlm(tmp_path, "tiny", seed=0, adapters=False, dtype="bfloat16")
    model = AutoModelForImageTextToText.from_pretrained(vlm.base, dtype="auto")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32  # restored after the build


def test_saved_model_loads_back_with_random_projection_and_eos(tiny_vlm):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    proc = AutoProcessor.from_pretrained(tiny_vlm.base)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm.base)
    tok = proc.tokenizer
    assert proc.image_seq_length == SIZES["tiny"]["mm_tokens_per_image"]
    assert model.config.image_token_id == tok.image_token_id
    assert model.config.get_text_config().vocab_size == len(tok)
    # DESIGN §6: a fresh Gemma3 zeroes this weight; ours must not be zero.
    proj = model.model.multi_modal_projector.mm_input_projection_weight
    assert float(proj.detach().abs().mean()) > 1e-3
    assert list(model.generation_config.eos_token_id) == [
        tok.convert_tokens_to_ids("<eos>"),
        tok.convert_tokens_to_ids("<end_of_turn>"),
    ]
    assert torch.equal(
        model.model.multi_modal_projector.mm_input_projection_weight,
        AutoModelForImageTextToText.from_pretrained(
            tiny_vlm.base
        ).model.multi_modal_projector.mm_input_projection_weight,
    )


def test_adapters_touch_only_the_language_model(tiny_vlm):
    from safetensors.numpy import load_file

    for folder, _name in ((tiny_vlm.init, "init"), (tiny_vlm.rev, "rev")):
        cfg = json.loads((folder / "adapter_config.json").read_text())
        assert cfg["r"] == SIZES["tiny"]["lora_r"]
        keys = list(load_file(folder / "adapter_model.safetensors"))
        assert keys and all("language_model" in k for k in keys), keys[:3]
        assert not any("vision" in k for k in keys)
    a = load_file(tiny_vlm.init / "adapter_model.safetensors")
    b = load_file(tiny_vlm.rev / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    # Randomly initialised (B not zero) and different from each other.
    lora_b = [k for k in a if "lora_B" in k]
    assert lora_b and all(np.abs(a[k]).max() > 0 for k in lora_b)
    assert any(not np.allclose(a[k], b[k]) for k in a)


def test_same_seed_same_weights(tmp_path):
    from safetensors.numpy import load_file

    a = build_random_vlm(tmp_path / "a", "tiny", seed=3, adapters=False)
    b = build_random_vlm(tmp_path / "b", "tiny", seed=3, adapters=False)
    assert a.init is None and a.rev is None
    wa, wb = load_file(a.base / "model.safetensors"), load_file(b.base / "model.safetensors")
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)
