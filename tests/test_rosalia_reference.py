"""ROSALIA's input pinned to the public reference code (KAIST-Edlab/ROSALIA: LISA's
``tokenizer_image_token`` with the slow Llama tokenizer of transformers 4.31, and
``inference_rosalia_example.py``): the prompt's token ids, and the image as given (no histogram
equalisation at inference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from monailabel_xflow.rosalia.model import RosaliaEncoder, RosaliaError, RosaliaModel
from monailabel_xflow.rosalia.predictor import RosaliaPredictor
from monailabel_xflow.rosalia.templates import IM_END, IM_START, IMAGE_TOKEN, SEG_TOKEN, SYSTEM, reference_ids

IMAGE_TOKENS = 3
WORDS = (SYSTEM + " USER: USER: ASSISTANT: ASSISTANT:: Segment the effusion in left lung. There is no").split()


@pytest.fixture(scope="module")
def llama_like():
    """A SentencePiece-like tokenizer: every piece of text it is given is split at spaces and gets
    the prefix ``▁`` (SentencePiece's dummy prefix, Metaspace here), ``<s>`` is added by the
    post-processor, and LISA's tokens are added tokens. Word-level, so its tokens can be written
    out below."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for w in WORDS:
        vocab.setdefault("▁" + w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens([SEG_TOKEN, IM_START, IM_END, IMAGE_TOKEN])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<unk>"
    )


def test_reference_tokens_pinned(llama_like):
    """What LISA's code feeds the model for one instruction, token by token: ``<s>`` once; the
    space before ``<im_start>`` and the newline after ``<im_end>`` stripped (its slow tokenizer
    strips whitespace around tokens added as plain strings); each text piece with its own ``▁``;
    the image between the two chunks; the answer after ``[SEG]`` without its space, then ``</s>``."""
    prompt, answer = reference_ids(
        llama_like, "Segment the effusion in the left lung.", IMAGE_TOKENS, "There is no effusion in the left lung."
    )
    tokens = llama_like.convert_ids_to_tokens(prompt)
    system = ["▁" + w for w in SYSTEM.split()]
    assert tokens == (
        ["<s>"]
        + system
        + ["▁USER:", IM_START]
        + [IMAGE_TOKEN] * IMAGE_TOKENS
        + [IM_END]
        + ["▁Segment", "▁the", "▁effusion", "▁in", "▁the", "▁left", "▁lung.", "▁ASSISTANT:"]
    )
    assert llama_like.convert_ids_to_tokens(answer) == [
        SEG_TOKEN,
        "▁There",
        "▁is",
        "▁no",
        "▁effusion",
        "▁in",
        "▁the",
        "▁left",
        "▁lung.",
        "</s>",
    ]
    # The prompt tokenised at once keeps what the reference strips, so the two differ on this tokenizer.
    whole = llama_like(
        f"{SYSTEM} USER: {IM_START}{IMAGE_TOKEN * IMAGE_TOKENS}{IM_END}\nSegment the effusion "
        "in the left lung. ASSISTANT:"
    )["input_ids"]
    assert whole != prompt


def test_encoder_feeds_the_reference_ids_and_refuses_an_unknown_tokenisation(llama_like):
    encoder = RosaliaEncoder(llama_like, IMAGE_TOKENS, clip_size=32, sam_size=64)
    assert encoder.tokenisation == "reference"
    text = encoder.text("Segment the effusion in the left lung.", "There is no effusion in the left lung.")
    prompt, answer = reference_ids(
        llama_like, "Segment the effusion in the left lung.", IMAGE_TOKENS, "There is no effusion in the left lung."
    )
    assert text.input_ids.tolist() == prompt + answer and text.prompt_length == len(prompt)
    assert encoder.text("Segment the effusion in the left lung.").input_ids.tolist() == prompt
    with pytest.raises(RosaliaError, match="tokenisation"):
        RosaliaEncoder(llama_like, IMAGE_TOKENS, clip_size=32, sam_size=64, tokenisation="fast")


def test_models_keep_the_tokenisation_they_were_trained_with(tiny_rosalia, tmp_path):
    """A new model uses the reference tokenisation and records it; a folder saved before the key
    existed (the committed demo) was trained on the whole prompt and is run that way."""
    import json
    import shutil

    model = RosaliaModel.from_pretrained(tiny_rosalia)
    assert model.encoder.tokenisation == "reference"
    assert json.loads((tiny_rosalia / "rosalia.json").read_text())["tokenisation"] == "reference"
    old = tmp_path / "old"
    shutil.copytree(tiny_rosalia, old)
    meta = json.loads((old / "rosalia.json").read_text())
    del meta["tokenisation"]
    (old / "rosalia.json").write_text(json.dumps(meta))
    assert RosaliaModel.from_pretrained(old).encoder.tokenisation == "whole-prompt"


def test_predictor_encodes_the_image_as_given(tiny_rosalia):
    """No histogram equalisation at inference (the public inference and evaluation code read the
    image and hand its pixels on); ``equalise=True`` gives the research snapshots' behaviour."""
    model = RosaliaModel.from_pretrained(tiny_rosalia)
    image = (np.linspace(0, 1, 48 * 40) ** 3).reshape(48, 40).astype(np.float32)  # a skewed histogram
    plain, equalised = model.encoder.image(image), model.encoder.image(image, equalise=True)
    assert not torch.equal(plain.sam_pixels, equalised.sam_pixels)
    predictor = RosaliaPredictor(model)
    predictor.set_image(image)
    assert torch.equal(predictor._image.sam_pixels, plain.sam_pixels)
    assert torch.equal(predictor._image.clip_pixels, plain.clip_pixels)
    snapshot = RosaliaPredictor(model, equalise=True)
    snapshot.set_image(image)
    assert torch.equal(snapshot._image.sam_pixels, equalised.sam_pixels)
