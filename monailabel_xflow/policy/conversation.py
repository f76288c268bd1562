"""The Gemma 3 conversations of both policies, as model inputs: the one encoder that inference
(:class:`~monailabel_xflow.policy.vlm.VLMPolicy`), SFT and GRPO all use (the role of a
transformers ``processing_*`` module).

A conversation is a sequence of **prompt** pieces (chat markup, text and one image, tokenised by
the processor, which expands the image placeholder into the image's soft tokens) and **answer**
pieces (the model's protocol text, then ``<end_of_turn>``):

* Stage 1: ``prompt(image, preamble + request)``, then the answer.
* Stage 2, turn 0: ``prompt(o_0, preamble + request(instruction, box))``, then the answer; turn
  ``t > 0``: ``prompt(o_t, follow-up)``, then the answer. The follow-up starts with
  ``<end_of_turn>`` only when the previous answer did not already end with it (an ``<eos>`` or a
  ``max_new_tokens`` cut at inference; training answers always end with it).

Prompt text comes from the chat template of the processor (Gemma 3's), and the follow-up turns
are the text that template renders after a model turn; :mod:`.prompts` holds the words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from monailabel_xflow.geometry import Box, check_image
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.policy.base import PolicyError
from monailabel_xflow.policy.prompts import stage1_messages, stage2_followup_text, stage2_messages

if TYPE_CHECKING:  # pragma: no cover
    import torch

IMAGE_TOKEN_TYPE = 1
"""``token_type_ids`` value of image soft tokens (0 elsewhere), as Gemma 3 expects."""


@dataclass
class Piece:
    """Model inputs of one piece of a conversation.

    Attributes:
        input_ids: ``(1, N)`` long.
        token_type_ids: ``(1, N)`` long, :data:`IMAGE_TOKEN_TYPE` on image soft tokens, 0 elsewhere.
        pixel_values: ``(n_images, 3, S, S)`` float, or None for a piece without images.
    """

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    pixel_values: torch.Tensor | None

    def to(self, device, dtype) -> Piece:
        """The same piece on ``device``, pixels in ``dtype``."""
        pixels = None if self.pixel_values is None else self.pixel_values.to(device, dtype)
        return Piece(self.input_ids.to(device), self.token_type_ids.to(device), pixels)


class ConversationEncoder:
    """Encodes XFlow's conversations for one Gemma 3 processor.

    Args:
        processor: the policy's ``Gemma3Processor`` (chat template, tokenizer, image processor).

    Raises:
        PolicyError: a tokenizer without ``<end_of_turn>`` (not a Gemma 3 chat tokenizer).
    """

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        tok = processor.tokenizer
        self.end_of_turn = tok.convert_tokens_to_ids("<end_of_turn>")
        if self.end_of_turn is None or self.end_of_turn == tok.unk_token_id:
            raise PolicyError("the tokenizer has no <end_of_turn> token (not a Gemma 3 chat tokenizer)")
        self.image_token = getattr(processor, "image_token", None) or "<start_of_image>"
        eos = [tok.eos_token_id, self.end_of_turn]
        self.stop_ids = [int(i) for i in eos if i is not None and i != tok.unk_token_id]
        """Token ids that end a model turn."""
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.stop_ids[0]

    # -- pieces ------------------------------------------------------------------------------------

    def prompt(self, text: str, images: list) -> Piece:
        """Tokenise rendered chat text; each image placeholder expands to the image's soft tokens."""
        import torch

        enc = self.processor(text=text, images=images or None, return_tensors="pt", add_special_tokens=False)
        ids = enc["input_ids"]
        tti = enc.get("token_type_ids")
        return Piece(ids, torch.zeros_like(ids) if tti is None else tti, enc.get("pixel_values"))

    def answer(self, text: str) -> Piece:
        """An answer as training teaches it: the protocol text's tokens, then ``<end_of_turn>``."""
        import torch

        ids = list(self.processor.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.end_of_turn]
        ids_t = torch.tensor([ids], dtype=torch.long)
        return Piece(ids_t, torch.zeros_like(ids_t), None)

    def decode(self, ids) -> str:
        """Generated token ids -> the answer's protocol text (special tokens dropped)."""
        return self.processor.tokenizer.decode(ids, skip_special_tokens=True).strip()

    # -- the two stages --------------------------------------------------------------------------

    def stage1_prompt(self, image: Any, instruction: Instruction) -> Piece:
        """Stage 1: the radiograph (``(H, W)`` float in ``[0, 1]``, or the PIL image
        :func:`image_to_pil` makes of it), the preamble and the request."""
        return self.prompt(self._stage1_text(instruction), [_picture(image)])

    def stage1_prompts(self, image: Any, instructions: Sequence[Instruction]) -> list[Piece]:
        """The Stage 1 prompts of several instructions about one image ("all findings"), equal to
        :meth:`stage1_prompt` of each, with the image prepared once: one PIL image, one pass of
        the image processor; the other prompts reuse its ``pixel_values`` and only tokenise text.

        A processor whose image expansion this cannot reproduce (checked on the first prompt,
        e.g. Gemma 3's pan-and-scan crops) gets every prompt through :meth:`stage1_prompt`.
        """
        picture = _picture(image)
        texts = [self._stage1_text(i) for i in instructions]
        if not texts:
            return []
        first = self.prompt(texts[0], [picture])
        again = self._text_with_image(texts[0], first.pixel_values)
        if again is None or not (
            _torch_equal(again.input_ids, first.input_ids) and _torch_equal(again.token_type_ids, first.token_type_ids)
        ):
            return [first, *(self.prompt(t, [picture]) for t in texts[1:])]
        rest = [self._text_with_image(t, first.pixel_values) for t in texts[1:]]
        return [
            first,
            *(p if p is not None else self.prompt(t, [picture]) for p, t in zip(rest, texts[1:], strict=True)),
        ]

    def _stage1_text(self, instruction: Instruction) -> str:
        text = self.processor.apply_chat_template(
            stage1_messages(instruction), add_generation_prompt=True, tokenize=False
        )
        return str(text)

    def _text_with_image(self, text: str, pixel_values: torch.Tensor | None) -> Piece | None:
        """``text`` with its one image placeholder expanded as the processor expands it, tokenised
        without touching the image; None when the processor does not say how it expands."""
        sequence = getattr(self.processor, "full_image_sequence", None)
        placeholder = getattr(self.processor, "boi_token", None)
        soft = getattr(self.processor.tokenizer, "image_token_id", None)
        if not (isinstance(sequence, str) and isinstance(placeholder, str) and soft is not None):
            return None
        if text.count(placeholder) != 1:
            return None
        tokens = self.processor.tokenizer(
            text.replace(placeholder, sequence), add_special_tokens=False, return_tensors="pt"
        )
        ids = tokens["input_ids"]
        return Piece(ids, (ids == soft).long() * IMAGE_TOKEN_TYPE, pixel_values)

    def stage2_prompt(
        self, observation: Any, instruction: Instruction, box: Box, turn: int, closes_model_turn: bool = False
    ) -> Piece:
        """Stage 2 turn ``turn``: the observation (``(H, W, 3)`` uint8 or an RGB PIL image) and,
        at turn 0, the preamble and request about ``box``; later, the follow-up text (see the
        module docstring for ``closes_model_turn``)."""
        if turn == 0:
            text = self.processor.apply_chat_template(
                stage2_messages(instruction, box), add_generation_prompt=True, tokenize=False
            )
        else:
            text = stage2_followup_text(self.image_token, closes_model_turn)
        image = observation if not isinstance(observation, np.ndarray) else observation_to_pil(observation)
        return self.prompt(text, [image])


def _picture(image: Any) -> Any:
    """The PIL image the processor takes: ``image`` itself, or :func:`image_to_pil` of an array."""
    return image_to_pil(image) if isinstance(image, np.ndarray) else image


def _torch_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and values."""
    import torch

    return a.shape == b.shape and bool(torch.equal(a, b))


def image_to_pil(image: np.ndarray):
    """``(H, W)`` float radiograph in ``[0, 1]`` -> 8-bit grey RGB PIL image, as the VLM sees it.

    Raises:
        GeometryError: not a radiograph array (:func:`~monailabel_xflow.geometry.check_image`).
    """
    from PIL import Image

    u8 = np.round(check_image(image) * 255.0).astype(np.uint8)
    return Image.fromarray(u8, mode="L").convert("RGB")


def observation_to_pil(observation: np.ndarray):
    """``(H, W, 3)`` uint8 rendered observation -> RGB PIL image.

    Raises:
        PolicyError: not ``(H, W, 3)`` uint8.
    """
    from PIL import Image

    a = np.asarray(observation)
    if a.ndim != 3 or a.shape[2] != 3 or a.dtype != np.uint8:
        raise PolicyError(f"observation must be (H, W, 3) uint8, got {a.dtype} {a.shape}")
    return Image.fromarray(a, mode="RGB")
