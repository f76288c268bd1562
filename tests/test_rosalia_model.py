"""ROSALIA as a model: sizes, input, the [SEG] embedding, decoding, the predictor API, templates."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from monailabel_xflow.instructions import Instruction, InstructionError
from monailabel_xflow.rosalia.configs import (
    SIZES,
    build_tokenizer,
    llava_config,
    sam_config,
)
from monailabel_xflow.rosalia.model import RosaliaError, RosaliaModel, dice_loss, equalize
from monailabel_xflow.rosalia.predictor import RosaliaPredictor
from monailabel_xflow.rosalia.templates import SEG_TOKEN, SYSTEM, read_answer, rosalia_answer


def seg_first(model: RosaliaModel) -> None:
    """Make greedy decoding start with [SEG] (a random model rarely does)."""
    model.llava.generation_config.sequence_bias = {(model.seg_token_id,): 100.0}


def test_tokenizer_has_lisas_tokens_as_single_tokens():
    tok = build_tokenizer()
    ids = tok("[SEG] There is no effusion.<im_start><image><im_end>", add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids(SEG_TOKEN)
    assert tok.convert_tokens_to_ids(["<unk>", "<s>", "</s>"]) == [0, 1, 2]
    assert tok.convert_ids_to_tokens(ids[-3:]) == ["<im_start>", "<image>", "<im_end>"]


def test_real_size_is_lisa_7b_geometry():
    llava, sam = llava_config("lisa-7b"), sam_config("lisa-7b")
    assert llava.text_config.hidden_size == 4096 and llava.text_config.num_hidden_layers == 32
    assert llava.vision_config.image_size == 224 and llava.image_seq_length == 256  # CLIP ViT-L/14
    v = sam.vision_config
    assert (v.hidden_size, v.num_hidden_layers, v.num_attention_heads, v.image_size) == (1280, 32, 16, 1024)
    assert v.global_attn_indexes == [7, 15, 23, 31] and sam.prompt_encoder_config.hidden_size == 256
    assert SIZES["lisa-7b"]["lora_r"] == 128


def test_folder_round_trip_keeps_every_weight(tiny_rosalia, tmp_path):
    model = RosaliaModel.from_pretrained(tiny_rosalia)
    again = RosaliaModel.from_pretrained(model.save_pretrained(tmp_path / "copy"))
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tiny_rosalia / "rosalia.json").read_text())["format"] == "rosalia"
    with pytest.raises(RosaliaError, match="not a ROSALIA model folder"):
        RosaliaModel.from_pretrained(tmp_path)


def test_input_follows_sam_and_llava_v1(tiny_rosalia):
    model = RosaliaModel.from_pretrained(tiny_rosalia)
    image = np.tile(np.linspace(0, 1, 50, dtype=np.float32), (80, 1))  # 80 x 50: portrait
    enc = model.encoder.image(image)
    s = model.encoder.sam_size
    assert enc.sam_pixels.shape == (3, s, s) and enc.resized == (s, round(50 * s / 80)) and enc.original == (80, 50)
    assert torch.all(enc.sam_pixels[:, :, enc.resized[1] :] == 0)  # padded on the right
    text = model.encoder.text("Segment the effusion in the left lung.", "There is no effusion in the left lung.")
    decoded = model.tokenizer.decode(text.input_ids)
    # the reference tokenisation: whitespace around LISA's added tokens stripped (tests/test_rosalia_reference.py)
    assert decoded.startswith("<s>" + SYSTEM + " USER:<im_start><image>")
    assert "<im_end>Segment the effusion in the left lung. ASSISTANT:[SEG]There is no" in decoded
    assert decoded.endswith("</s>")
    assert text.input_ids[text.prompt_length] == model.seg_token_id  # the answer starts with [SEG]
    assert (text.labels[: text.prompt_length] == -100).all() and (text.labels[text.prompt_length :] >= 0).all()


def test_equalisation_flattens_the_histogram():
    ramp = (np.linspace(0, 1, 64)[None] ** 4 * 255).astype(np.uint8).repeat(16, 0)
    out = equalize(ramp)
    assert out.dtype == np.uint8 and out.max() == 255
    assert abs(np.median(out) - 128) < abs(np.median(ramp) - 128)


def test_training_and_inference_decode_the_same_mask(tiny_rosalia):
    """The predictor's mask is the one the training forward decodes from the same prompt and the
    image as given (no histogram equalisation at inference)."""
    model = RosaliaModel.from_pretrained(tiny_rosalia)
    seg_first(model)
    predictor = RosaliaPredictor(model)
    rng = np.random.default_rng(1)
    image = rng.random((70, 90)).astype(np.float32)
    predictor.set_image(image)
    mask, answer, trace = predictor.predict("fluid at the left base?")
    assert trace["seg_tokens"] >= 1 and trace["raw_text"].startswith(SEG_TOKEN)
    enc = model.encoder.image(image)  # not equalised, as the public inference code
    assert not torch.equal(enc.sam_pixels, model.encoder.image(image, equalise=True).sam_pixels)
    text = model.encoder.text(Instruction("effusion", ("left lung base",)).text)
    with torch.no_grad():
        out = model.llava(input_ids=text.input_ids[None], pixel_values=enc.clip_pixels[None], output_hidden_states=True)
        prompt = model.text_hidden_fcs(out.hidden_states[-1][:, text.prompt_length - 1])
        low = model.decode_masks(model.image_embeddings(enc.sam_pixels[None]), prompt)
        want = model.postprocess(low[0], enc.resized, enc.original) > 0
    assert mask.shape == (70, 90) and np.array_equal(mask, want.numpy())
    assert "[SEG]" not in answer
    assert answer == ("" if mask.any() else "There is no effusion in the left lung base.")


def test_predictor_asks_many_questions_of_one_image(tiny_rosalia):
    predictor = RosaliaPredictor.from_pretrained(tiny_rosalia, device="cpu")
    with pytest.raises(RosaliaError, match="set_image"):
        predictor.predict("Segment the edema.")
    predictor.set_image((np.random.default_rng(0).random((40, 40)) * 255).astype(np.uint8))
    for text in ("Segment the edema.", "Segment the opacity in the right lung and predict its type."):
        mask, answer, trace = predictor.predict(text)
        assert mask.shape == (40, 40) and isinstance(answer, str) and trace["model"] == "rosalia"
        json.dumps(trace)
    with pytest.raises(InstructionError):
        predictor.predict("Segment the pneumothorax.")


def test_answers_use_rosalias_templates_and_hide_seg():
    basic = Instruction("effusion", ("left lung",))
    glob = Instruction("edema", kind="global")
    lesion = Instruction("opacity", ("right lung",), kind="lesion_inference")
    assert rosalia_answer("") == "[SEG]"
    assert rosalia_answer(basic.absent_answer()) == "[SEG] There is no effusion in the left lung."
    r = read_answer("[SEG]", basic)
    assert (r.says_present, r.sentence, r.problems) == (True, "", [])
    r = read_answer("[SEG] There is no edema.", glob)
    assert (r.says_present, r.sentence) == (False, "There is no edema.")
    r = read_answer("[SEG] It is located in the left lung base and right lung.", glob)
    assert r.says_present and r.located == ("left lung base", "right lung")
    r = read_answer("[SEG] It possibly reflects atelectasis.", lesion)
    assert r.lesion == ("atelectasis", False) and r.sentence == "It possibly reflects atelectasis."
    r = read_answer("It is located in the moon.", glob)
    assert r.says_present is None and len(r.problems) == 2


def test_dice_loss_is_lisas():
    logits = torch.tensor([[10.0, -10.0], [10.0, -10.0]])
    assert dice_loss(logits, torch.tensor([[1.0, 0.0], [1.0, 0.0]])) < 1e-3
    assert dice_loss(logits, torch.tensor([[0.0, 1.0], [0.0, 1.0]])) > 0.99
