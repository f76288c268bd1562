"""The two XFlow policies: π_init (Stage 1) and π_rev (Stage 2) (paper §4, DESIGN §3 and §6).

A policy turns pictures and an instruction into *raw protocol text*; the workflow parses that
text with :mod:`monailabel_xflow.policy.protocol` (a model's output is untrusted input, and the trace
keeps the raw text). Three families implement the protocols below:

* :class:`VLMPolicy`: a Gemma3 vision-language model (MedGemma-1.5-4B-it in the paper) with π_init
  and π_rev as two peft LoRA adapters, ``"init"`` and ``"rev"``, on one shared base model.
* :class:`ScriptedPolicy`: replays given protocol text (tests; replaying a stored trace).
* :class:`OracleRevisionPolicy`: the simulated user of Algorithm 1 acting as π_rev.

Prompts (the text is fixed here, once, so SFT examples built elsewhere can use the same
functions: :func:`stage1_messages`, :func:`stage2_messages`, :func:`stage2_followup_text`):

* **Stage 1**, one user turn: the radiograph, then :data:`STAGE1_PREAMBLE`, then the
  instruction-specific request, e.g. for "Segment the effusion in the left lung."::

      <image>You are a radiologist reading a chest X-ray. Write every box as (x1,y1),(x2,y2)
      with integers from 0 to 1000, x first.
      First ground the left lung with a box, then decide whether the finding asked for is
      present, then draw a box around each lesion. Segment the effusion in the left lung.

  A chest-level question asks to ground "the right lung and the left lung" (both lungs), a
  one-sided question only that lung (:attr:`Instruction.lungs`). The instruction-specific part
  comes last so that "all findings" can prefill everything up to it once (see
  :meth:`VLMPolicy.stage1_many`).
* **Stage 2**, one growing conversation per lesion mask. The first user turn holds the
  observation o_0 (the radiograph with the current mask and clicks drawn on it, rendered by
  :func:`monailabel_xflow.rendering.render_observation`), :data:`STAGE2_PREAMBLE`, the
  instruction, the box that prompted the mask and the request for one action; each later user
  turn holds the new observation o_t and :data:`STAGE2_FOLLOWUP`. The model answers every turn
  with one ``<click>…</click>`` or ``<stop/>`` (policy/protocol.py).

Stage 2 reuses the key/value cache of the previous turn instead of re-reading the conversation
(DESIGN §6): the next turn's token ids are *appended* to the previous ``generate`` output (never
re-rendered from decoded text, which changes the ids), ``token_type_ids`` cover the whole
sequence, and ``pixel_values`` hold only the new observation. A cache is only ever used under the
adapter that built it (LoRA changes every layer's keys and values).

Heavy libraries (torch, transformers, peft) are imported inside functions.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from monailabel_xflow.geometry import Box, Click
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.policy.protocol import Stage2Action, box_text, format_stage2
from monailabel_xflow.weights import choose_device, choose_dtype, looks_like_local_path

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "RevisionState",
    "Stage1Policy",
    "RevisionSession",
    "RevisionPolicy",
    "PolicyError",
    "ScriptExhausted",
    "GenerationSettings",
    "PolicyInputs",
    "image_to_pil",
    "observation_to_pil",
    "VLMPolicy",
    "VLMRevisionSession",
    "ScriptedPolicy",
    "STOP_TEXT",
    "OracleRevisionPolicy",
    "INIT_ADAPTER",
    "REV_ADAPTER",
    "STAGE1_PREAMBLE",
    "STAGE2_PREAMBLE",
    "STAGE2_FOLLOWUP",
    "stage1_request",
    "stage1_messages",
    "stage2_request",
    "stage2_messages",
    "stage2_followup_text",
]

log = logging.getLogger(__name__)

INIT_ADAPTER = "init"
"""peft adapter name of π_init."""
REV_ADAPTER = "rev"
"""peft adapter name of π_rev."""


class PolicyError(ValueError):
    """Bad input to a policy (wrong image shape/dtype, out-of-order step, missing model file)."""


class ScriptExhausted(PolicyError):
    """A :class:`ScriptedPolicy` was asked for more Stage 1 answers than it was given."""


# --- the contract the workflow programs against -------------------------------------------


@dataclass
class RevisionState:
    """What a revision policy sees at step ``t``.

    Attributes:
        image: ``(H, W)`` float32 radiograph in ``[0, 1]``.
        instruction: the question being answered.
        box: current (grown) box, normalised xyxy (geometry.py).
        mask: ``(H, W)`` bool current mask M_t.
        clicks: clicks issued so far, normalised.
        observation: ``(H, W, 3)`` uint8, ``rendering.render_observation(image, mask, clicks)``.
        step: 0-based index of the turn about to be taken.
    """

    image: np.ndarray
    instruction: Instruction
    box: Box
    mask: np.ndarray
    clicks: list[Click]
    observation: np.ndarray
    step: int


@runtime_checkable
class Stage1Policy(Protocol):
    """π_init: grounds the lungs, decides presence and boxes the lesions, as protocol text."""

    def stage1(self, image: np.ndarray, instruction: Instruction) -> str: ...

    def stage1_many(self, image: np.ndarray, instructions: Sequence[Instruction]) -> list[str]: ...


@runtime_checkable
class RevisionSession(Protocol):
    """One Stage 2 conversation about one lesion mask; ``step`` returns one turn's raw text."""

    def step(self, state: RevisionState) -> str: ...


@runtime_checkable
class RevisionPolicy(Protocol):
    """π_rev: opens one :class:`RevisionSession` per initial mask."""

    def start(self, image: np.ndarray, instruction: Instruction, box: Box) -> RevisionSession: ...


# --- prompts --------------------------------------------------------------------------------

COORDINATES_NOTE = "with integers from 0 to 1000, x first"

STAGE1_PREAMBLE = f"You are a radiologist reading a chest X-ray. Write every box as (x1,y1),(x2,y2) {COORDINATES_NOTE}."
"""Text right after the image in Stage 1; identical for every instruction (shared prefix).
Everything that does not depend on the instruction belongs here: "all findings" prefills it once
and then runs only the short requests, one per finding (DESIGN §6)."""

STAGE2_PREAMBLE = (
    "You are a radiologist revising a lesion mask on a chest X-ray. The image shows the X-ray "
    "with the current mask overlaid and the clicks so far marked."
)
"""Text right after the first observation in Stage 2."""

STAGE2_FOLLOWUP = (
    "This is the mask after your click. Answer with one click, or stop if the mask follows "
    "the lesion."
)
"""Text of every later Stage 2 user turn, after the new observation."""


def _lungs_phrase(instruction: Instruction) -> str:
    lungs = instruction.lungs
    if len(lungs) == 1:
        return f"the {lungs[0]} with a box"
    return "the " + " and the ".join(lungs) + " with a box each"


def stage1_request(instruction: Instruction) -> str:
    """The instruction-specific part of the Stage 1 prompt (after :data:`STAGE1_PREAMBLE`).

    The instruction itself comes last: the seven "all findings" questions then differ only in
    their final few tokens, and everything before those is prefilled once.
    """
    return (
        f"First ground {_lungs_phrase(instruction)}, then decide whether the finding asked for is "
        f"present, then draw a box around each lesion. {instruction.text}"
    )


def _image_turn(text: str) -> list[dict[str, Any]]:
    """Chat messages of one user turn: an image, then ``text``."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def stage1_messages(instruction: Instruction) -> list[dict[str, Any]]:
    """Chat messages of the Stage 1 prompt (one user turn: image, preamble, request)."""
    return _image_turn(f"{STAGE1_PREAMBLE}\n{stage1_request(instruction)}")


def stage2_request(instruction: Instruction, box: Box) -> str:
    """The first Stage 2 request: instruction, the box that prompted the mask, one action."""
    return (
        f"{instruction.text} The mask was prompted by the box "
        f"{box_text(box)}. Answer with one click, positive to "
        f"grow the mask or negative to shrink it, written as <click>positive (x,y)</click> "
        f"{COORDINATES_NOTE}, or with <stop/> if the mask follows the lesion."
    )


def stage2_messages(instruction: Instruction, box: Box) -> list[dict[str, Any]]:
    """Chat messages of the first Stage 2 user turn (observation o_0, preamble, request)."""
    return _image_turn(f"{STAGE2_PREAMBLE}\n{stage2_request(instruction, box)}")


def stage2_followup_text(image_token: str, closes_model_turn: bool) -> str:
    """Token text appended after the model's answer to start the next Stage 2 turn.

    Gemma3's chat template renders a model turn as ``<start_of_turn>model\\n…<end_of_turn>\\n``
    and a user turn as ``<start_of_turn>user\\n…<end_of_turn>\\n``; this is the text that follows
    the model's generated tokens in that rendering.

    Args:
        image_token: the processor's image placeholder (``<start_of_image>`` for Gemma3).
        closes_model_turn: True if the generated tokens did not already end with
            ``<end_of_turn>`` (an ``<eos>`` or a ``max_new_tokens`` cut), so it must be added.
    """
    close = "<end_of_turn>" if closes_model_turn else ""
    return (
        f"{close}\n<start_of_turn>user\n{image_token}{STAGE2_FOLLOWUP}<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


# --- images ---------------------------------------------------------------------------------


def image_to_pil(image: np.ndarray):
    """``(H, W)`` float radiograph in ``[0, 1]`` → 8-bit grey RGB PIL image, as the VLM sees it.

    Training code uses this too, so that both see the same pixels.

    Raises:
        PolicyError: not a finite 2-D float array.
    """
    from PIL import Image

    a = np.asarray(image)
    if a.ndim != 2 or not np.issubdtype(a.dtype, np.floating):
        raise PolicyError(f"image must be a 2-D float array in [0, 1], got {a.dtype} {a.shape}")
    if not np.isfinite(a).all():
        raise PolicyError("image contains NaN or infinite values")
    u8 = np.round(np.clip(a, 0.0, 1.0) * 255.0).astype(np.uint8)
    return Image.fromarray(u8, mode="L").convert("RGB")




def observation_to_pil(observation: np.ndarray):
    """``(H, W, 3)`` uint8 rendered observation → RGB PIL image.

    Raises:
        PolicyError: not ``(H, W, 3)`` uint8.
    """
    from PIL import Image

    a = np.asarray(observation)
    if a.ndim != 3 or a.shape[2] != 3 or a.dtype != np.uint8:
        raise PolicyError(f"observation must be (H, W, 3) uint8, got {a.dtype} {a.shape}")
    return Image.fromarray(a, mode="RGB")


# --- the VLM --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationSettings:
    """How a policy decodes. Greedy by default (deterministic, what evaluation uses).

    Attributes:
        do_sample: sample instead of taking the most likely token.
        temperature: softmax temperature when sampling (paper RL rollouts: 1.0).
        top_p: nucleus threshold when sampling (π_rev RL: 0.95).
        max_new_tokens: cap on tokens generated per call (per turn in Stage 2).
        seed: when sampling, ``torch.manual_seed(seed)`` before each ``generate`` call, so a
            call is reproducible; None leaves the global generator alone.

    Raises:
        PolicyError: a value out of range.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise PolicyError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature <= 0:
            raise PolicyError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise PolicyError(f"top_p must lie in (0, 1], got {self.top_p}")

    def generate_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``model.generate``."""
        kw: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": self.do_sample}
        if self.do_sample:
            kw.update(temperature=self.temperature, top_p=self.top_p, top_k=0)
        else:  # neutralise sampling fields a checkpoint's generation_config may carry
            kw.update(temperature=None, top_p=None, top_k=None)
        return kw


@dataclass
class PolicyInputs:
    """Token ids of (part of) a conversation and the pixels of the images in it.

    Attributes:
        input_ids: ``(1, N)`` long, on the model's device.
        token_type_ids: ``(1, N)`` long, 1 on image soft tokens, 0 elsewhere.
        pixel_values: ``(n_images, 3, S, S)`` in the model's dtype, or None without images.
    """

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    pixel_values: torch.Tensor | None


class VLMPolicy:
    """π_init and π_rev on one Gemma3 vision-language model (both policy protocols).

    The two policies are peft LoRA adapters named ``"init"`` and ``"rev"`` on one shared base
    model (one copy of the weights; ``set_adapter`` switches). A stage whose adapter is absent
    runs the base model with adapters disabled, so a merged checkpoint (or two: build two
    policies) can be served too.

    Args:
        model: an ``AutoModelForImageTextToText`` model, or a ``peft.PeftModel`` around one
            holding adapters ``"init"`` and/or ``"rev"``; in eval mode.
        processor: its ``AutoProcessor`` (Gemma3Processor).
        generation: decoding settings for both stages.
        reuse_cache: Stage 2 reuses the previous turn's KV cache (True) or re-reads the whole
            conversation every turn (False; same token ids, for benchmarks and tests).
        batch_stage1: :meth:`stage1_many` decodes all instructions in one batch (default:
            decoding is shared, equal to one-by-one up to floating point) or one after the
            other from the shared prefix (False: token for token what :meth:`stage1` gives).

    Not thread-safe: the active adapter is state of the shared model. Each revision session
    keeps its own KV cache (built under "rev") until it is dropped.
    """

    def __init__(self, model, processor, generation: GenerationSettings | None = None,
                 reuse_cache: bool = True, batch_stage1: bool = True) -> None:
        self.model = model
        self.processor = processor
        self.generation = generation or GenerationSettings()
        self.reuse_cache = reuse_cache
        self.batch_stage1 = batch_stage1
        tok = processor.tokenizer
        self._image_token = getattr(processor, "image_token", None) or "<start_of_image>"
        self._end_of_turn = tok.convert_tokens_to_ids("<end_of_turn>")
        eos = [tok.eos_token_id, self._end_of_turn]
        self._eos_ids = [int(i) for i in eos if i is not None and i != tok.unk_token_id]
        self._pad_id = tok.pad_token_id if tok.pad_token_id is not None else self._eos_ids[0]
        self._image_token_type = 1
        # Image placeholders are never a valid answer; a near-flat policy sampling one would
        # break the next forward ("image features and image tokens do not match").
        config = getattr(model, "config", None)
        image_ids = [getattr(config, k, None) for k in ("image_token_id", "boi_token_id", "eoi_token_id")]
        image_ids += [tok.convert_tokens_to_ids(t) for t in ("<image_soft_token>", "<start_of_image>", "<end_of_image>")]
        self._suppress_ids = sorted({int(i) for i in image_ids if isinstance(i, int) and i != tok.unk_token_id})
        self.adapters: frozenset[str] = frozenset(getattr(model, "peft_config", {}) or {})
        # Smallest sliding attention window (None: every layer attends to the whole sequence).
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        layer_types = getattr(text_config, "layer_types", None) or ()
        window = getattr(text_config, "sliding_window", None)
        self._sliding_window = window if window and "sliding_attention" in layer_types else None

    # -- loading -------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        base: str | Path,
        init_adapter: str | Path | None = None,
        rev_adapter: str | Path | None = None,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        generation: GenerationSettings | None = None,
        reuse_cache: bool = True,
        batch_stage1: bool = True,
    ) -> VLMPolicy:
        """Load the base model, its processor and up to two LoRA adapters.

        Args:
            base: local folder (or a hub id, passed through to transformers untouched) of the
                base model and processor.
            init_adapter: folder / hub id of π_init's adapter, loaded as ``"init"``; None runs
                Stage 1 on the base model.
            rev_adapter: folder / hub id of π_rev's adapter, loaded as ``"rev"``; None runs
                Stage 2 on the base model.
            device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``…; default CUDA if available, else CPU.
            dtype: e.g. ``"bfloat16"`` or ``torch.float32``; default float32 on CPU, bfloat16
                on CUDA.
            generation, reuse_cache, batch_stage1: see the class.

        Raises:
            PolicyError: a local path that does not exist.
        """
        from transformers import AutoModelForImageTextToText, AutoProcessor

        for name, p in (("base", base), ("init_adapter", init_adapter), ("rev_adapter", rev_adapter)):
            if p is not None and looks_like_local_path(p) and not Path(p).exists():
                raise PolicyError(f"{name} folder {p} does not exist")
        device = choose_device(device)
        dtype = choose_dtype(device, dtype)
        t0 = time.perf_counter()
        processor = AutoProcessor.from_pretrained(str(base))
        model = AutoModelForImageTextToText.from_pretrained(str(base), dtype=dtype)
        adapters = [(INIT_ADAPTER, init_adapter), (REV_ADAPTER, rev_adapter)]
        adapters = [(n, p) for n, p in adapters if p is not None]
        if adapters:
            from peft import PeftModel

            (name, p), rest = adapters[0], adapters[1:]
            model = PeftModel.from_pretrained(model, str(p), adapter_name=name, is_trainable=False)
            for name, p in rest:
                model.load_adapter(str(p), adapter_name=name, is_trainable=False)
        model.to(device).eval()
        log.info("loaded policy model from %s (adapters: %s) in %.1f s",
                 base, [n for n, _ in adapters] or "none", time.perf_counter() - t0)
        return cls(model, processor, generation=generation, reuse_cache=reuse_cache,
                   batch_stage1=batch_stage1)

    # -- plumbing --------------------------------------------------------------------------------

    @property
    def device(self):
        return next(self.model.parameters()).device

    @contextlib.contextmanager
    def _adapter(self, name: str) -> Iterator[None]:
        """Run the block under adapter ``name``, or the bare base model if it is not loaded."""
        if name in self.adapters:
            if self.model.active_adapter != name:
                self.model.set_adapter(name)
            yield
        elif self.adapters:
            with self.model.disable_adapter():
                yield
        else:
            yield

    def _encode(self, text: str, images: list) -> PolicyInputs:
        """Tokenise rendered text; each image placeholder expands to the image's soft tokens."""
        import torch

        enc = self.processor(text=text, images=images or None, return_tensors="pt",
                             add_special_tokens=False)
        ids = enc["input_ids"]
        tti = enc.get("token_type_ids")
        if tti is None:
            tti = torch.zeros_like(ids)
        pixels = enc.get("pixel_values")
        dev = self.device
        return PolicyInputs(ids.to(dev), tti.to(dev),
                            None if pixels is None else pixels.to(dev, self.model.dtype))

    def stage1_inputs(self, image: np.ndarray, instruction: Instruction) -> PolicyInputs:
        """Model inputs of the Stage 1 prompt (exposed for tests and training code)."""
        text = self.processor.apply_chat_template(
            stage1_messages(instruction), add_generation_prompt=True, tokenize=False)
        return self._encode(text, [image_to_pil(image)])

    def _generate(self, enc: PolicyInputs, cache=None, pixel_values=None, attention_mask=None):
        """One ``generate`` call over the whole sequence so far (DESIGN §6's working call).

        Args:
            enc: all token ids so far (those in ``cache`` included) and their token types.
            cache: a cache holding a prefix of ``enc`` (mutated in place), or None.
            pixel_values: pixels of exactly the images not yet in ``cache``.
            attention_mask: default all ones (no padding).
        """
        import torch

        settings = self.generation
        if settings.do_sample and settings.seed is not None:
            torch.manual_seed(settings.seed)
        kwargs = dict(
            input_ids=enc.input_ids,
            attention_mask=torch.ones_like(enc.input_ids) if attention_mask is None else attention_mask,
            token_type_ids=enc.token_type_ids,
            return_dict_in_generate=True,
            eos_token_id=self._eos_ids,
            pad_token_id=self._pad_id,
            suppress_tokens=self._suppress_ids or None,
            # dynamic (growable) cache always: a static one could not take the next turn
            cache_implementation=None,
            **settings.generate_kwargs(),
        )
        if pixel_values is not None:
            kwargs["pixel_values"] = pixel_values
        if cache is not None:
            kwargs["cache"] = cache
        with torch.inference_mode():
            return self.model.generate(**kwargs)

    def _decode(self, new_ids) -> str:
        return self.processor.tokenizer.decode(new_ids, skip_special_tokens=True).strip()

    # -- Stage 1 ---------------------------------------------------------------------------------

    def stage1(self, image: np.ndarray, instruction: Instruction) -> str:
        """π_init's raw answer to one instruction (protocol text: lungs, presence, lesions)."""
        enc = self.stage1_inputs(image, instruction)
        with self._adapter(INIT_ADAPTER):
            out = self._generate(enc, pixel_values=enc.pixel_values)
        return self._decode(out.sequences[0, enc.input_ids.shape[1]:])

    def stage1_many(self, image: np.ndarray, instructions: Sequence[Instruction]) -> list[str]:
        """π_init's answers to several instructions about one image ("all findings").

        The prompts share everything up to the instruction-specific request, including the
        whole image block. That common prefix is run through the model once. Then either

        * ``batch_stage1=False``: each instruction continues from a deep copy of the
          prefix cache in its own ``generate`` call. The token ids are exactly those of
          :meth:`stage1`, so greedy outputs are identical to asking one by one; or
        * ``batch_stage1=True`` (default): all instructions continue in one batched ``generate`` call
          (the prefix cache repeated per row, each request padded on the left of the request,
          i.e. between prefix and request, with the padding masked and positions taken from
          the attention mask). Decoding is then shared, which matters because Stage 1 answers
          are dozens of tokens; greedy outputs agree with one by one up to the floating-point
          differences of batched kernels (near-ties of a random model's flat logits may flip).
          A model with a sliding attention window shorter than prompt + ``max_new_tokens``
          takes the exact path instead: its window would count the padding as tokens.
        """
        import torch

        instructions = list(instructions)
        if len(instructions) <= 1:
            return [self.stage1(image, i) for i in instructions]
        encs = [self.stage1_inputs(image, i) for i in instructions]
        prefix = _common_prefix_length([e.input_ids[0] for e in encs])
        prefix = min(prefix, min(e.input_ids.shape[1] for e in encs) - 1)
        image_pos = torch.nonzero(encs[0].token_type_ids[0] == self._image_token_type)
        if image_pos.numel() == 0 or prefix <= int(image_pos.max()):
            log.warning("Stage 1 prompts share no whole image block; asking one by one")
            return [self.stage1(image, i) for i in instructions]
        longest = max(e.input_ids.shape[1] for e in encs) + self.generation.max_new_tokens
        # A sliding window counts the padding slots of a batch as tokens, so batching is exact
        # only while the longest row fits in the window (MedGemma: 1,024 tokens; Stage 1 ~400).
        batched = self.batch_stage1 and (self._sliding_window is None or longest <= self._sliding_window)
        with self._adapter(INIT_ADAPTER):
            cache = self._prefill(encs[0], prefix)
            if batched:
                return self._continue_batched(encs, prefix, cache)
            texts = []
            for k, enc in enumerate(encs):
                branch = cache if k == len(encs) - 1 else copy.deepcopy(cache)  # generate mutates
                out = self._generate(enc, cache=branch)
                texts.append(self._decode(out.sequences[0, enc.input_ids.shape[1]:]))
        return texts

    def _continue_batched(self, encs: list[PolicyInputs], prefix: int, cache) -> list[str]:
        """One batched ``generate`` over all prompts, from the shared prefix ``cache``."""
        import torch

        n = len(encs)
        width = max(e.input_ids.shape[1] for e in encs) - prefix
        ids = torch.full((n, prefix + width), self._pad_id, dtype=torch.long, device=self.device)
        mask, tti = torch.zeros_like(ids), torch.zeros_like(ids)
        for row, enc in enumerate(encs):
            start = prefix + width - (enc.input_ids.shape[1] - prefix)  # pad between prefix and request
            for dst, src in ((ids, enc.input_ids), (tti, enc.token_type_ids)):
                dst[row, :prefix] = src[0, :prefix]
                dst[row, start:] = src[0, prefix:]
            mask[row, :prefix] = 1
            mask[row, start:] = 1
        cache.batch_repeat_interleave(n)
        out = self._generate(PolicyInputs(ids, tti, None), cache=cache, attention_mask=mask)
        return [self._decode(out.sequences[row, prefix + width:]) for row in range(n)]

    def _prefill(self, enc: PolicyInputs, length: int):
        """Run the first ``length`` tokens (all images inside) and return their KV cache."""
        import torch

        ids = enc.input_ids[:, :length]
        with torch.inference_mode():
            out = self.model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                token_type_ids=enc.token_type_ids[:, :length],
                pixel_values=enc.pixel_values,
                use_cache=True,
                logits_to_keep=1,
            )
        return out.cache

    # -- Stage 2 ---------------------------------------------------------------------------------

    def start(self, image: np.ndarray, instruction: Instruction, box: Box) -> VLMRevisionSession:
        """Open a Stage 2 conversation about the mask that ``box`` prompted."""
        image_to_pil(image)  # validates; the model sees the image through the observations
        return VLMRevisionSession(self, instruction, tuple(float(v) for v in box))


def _common_prefix_length(seqs: list) -> int:
    """Length of the longest common prefix of 1-D tensors."""
    n = min(len(s) for s in seqs)
    first = seqs[0][:n]
    for s in seqs[1:]:
        diff = (s[:n] != first).nonzero()
        if diff.numel():
            n = int(diff[0])
            first = first[:n]
    return n


class VLMRevisionSession:
    """One Stage 2 conversation of a :class:`VLMPolicy` (π_rev adapter), turn by turn.

    Holds the conversation's token ids, token types, observations and (with
    ``policy.reuse_cache``) the KV cache left by the previous ``generate`` call. Each
    :meth:`step` appends one user turn (the new observation) to the ids of the previous output
    and generates one model turn.

    Attributes:
        texts: raw text of the model turns so far.
        input_ids: ``(1, N)`` ids of the whole conversation so far (None before step 0).
    """

    def __init__(self, policy: VLMPolicy, instruction: Instruction, box: Box) -> None:
        self.policy = policy
        self.instruction = instruction
        self.box = box
        self.texts: list[str] = []
        self.input_ids = None
        self._token_type_ids = None
        self._pixels: list = []  # (1, 3, S, S) per observation, in conversation order
        self._cache = None

    def step(self, state: RevisionState) -> str:
        """Show the observation of ``state`` and return the model's action as raw text.

        Raises:
            PolicyError: ``state.step`` is not the number of turns taken so far, or the
                observation is not ``(H, W, 3)`` uint8.
        """
        import torch

        p = self.policy
        if state.step != len(self.texts):
            raise PolicyError(f"revision step {state.step} out of order: {len(self.texts)} taken")
        obs = observation_to_pil(state.observation)
        if self.input_ids is None:
            text = p.processor.apply_chat_template(
                stage2_messages(self.instruction, self.box), add_generation_prompt=True,
                tokenize=False)
        else:
            last = int(self.input_ids[0, -1])
            text = stage2_followup_text(p._image_token, closes_model_turn=last != p._end_of_turn)
        turn = p._encode(text, [obs])
        if self.input_ids is None:
            ids, tti = turn.input_ids, turn.token_type_ids
        else:
            ids = torch.cat([self.input_ids, turn.input_ids], dim=1)
            tti = torch.cat([self._token_type_ids, turn.token_type_ids], dim=1)
        self._pixels.append(turn.pixel_values)
        enc = PolicyInputs(ids, tti, None)
        with p._adapter(REV_ADAPTER):
            if p.reuse_cache:
                out = p._generate(enc, cache=self._cache, pixel_values=turn.pixel_values)
                self._cache = out.cache
            else:
                out = p._generate(enc, pixel_values=torch.cat(self._pixels, dim=0))
        new = out.sequences[:, ids.shape[1]:]
        self.input_ids = out.sequences
        self._token_type_ids = torch.cat([tti, torch.zeros_like(new)], dim=1)
        text_out = p._decode(new[0])
        self.texts.append(text_out)
        return text_out


# --- replay ---------------------------------------------------------------------------------


class ScriptedPolicy:
    """Replays given protocol text, as π_init and π_rev (both protocols).

    Args:
        stage1_texts: Stage 1 answers, returned in order, one per instruction asked (across
            :meth:`stage1` and :meth:`stage1_many` calls).
        revision_texts: one list of turn texts per revision session, in the order sessions
            are started; session ``k`` returns ``revision_texts[k][t]`` at step ``t``.

    When the script runs out: a revision session with no text left (or a session beyond the
    given lists) returns a stop action (``format_stage2(Stage2Action(None))``), so a replayed
    trace always terminates; Stage 1 raises :class:`ScriptExhausted`, because there is no
    neutral Stage 1 answer to invent.
    """

    def __init__(self, stage1_texts: Sequence[str] = (),
                 revision_texts: Sequence[Sequence[str]] = ()) -> None:
        self._stage1 = list(stage1_texts)
        self._revisions = [list(t) for t in revision_texts]
        self._stage1_used = 0
        self._sessions = 0
        self.calls: list[tuple[str, Any]] = []  # ("stage1", instruction) / ("start", (instruction, box))

    def stage1(self, image: np.ndarray, instruction: Instruction) -> str:
        self.calls.append(("stage1", instruction))
        if self._stage1_used >= len(self._stage1):
            raise ScriptExhausted(f"script holds {len(self._stage1)} Stage 1 answer(s), all used")
        text = self._stage1[self._stage1_used]
        self._stage1_used += 1
        return text

    def stage1_many(self, image: np.ndarray, instructions: Sequence[Instruction]) -> list[str]:
        return [self.stage1(image, i) for i in instructions]

    def start(self, image: np.ndarray, instruction: Instruction, box: Box) -> _ScriptedSession:
        self.calls.append(("start", (instruction, tuple(box))))
        k = self._sessions
        self._sessions += 1
        return _ScriptedSession(self._revisions[k] if k < len(self._revisions) else [])


STOP_TEXT = format_stage2(Stage2Action(None))
"""What a revision session returns when it has nothing scripted: a plain stop."""


@dataclass
class _ScriptedSession:
    texts: list[str]
    steps: list[int] = field(default_factory=list)

    def step(self, state: RevisionState) -> str:
        self.steps.append(state.step)
        t = len(self.steps) - 1
        return self.texts[t] if t < len(self.texts) else STOP_TEXT


# --- the simulated user as π_rev -------------------------------------------------------------


class OracleRevisionPolicy:
    """The simulated user of Algorithm 1 (DESIGN §7) acting as a revision policy.

    Each turn asks :meth:`monailabel_xflow.policy.oracle.OracleClicker.decide` for the ground-truth
    component: stop once ``IoU(M, G) >= τ``, after ``T`` clicks, or when no admissible click is
    left; otherwise click the deepest point of the missed (positive) or over-segmented
    (negative) region. The decision is written with :func:`protocol.format_stage2`, with a short
    ``<think>`` naming the reason.

    Args:
        gt_mask: ``(H, W)`` bool ground-truth component G, same shape as the masks it will see.
        clicker: an ``OracleClicker`` (default: the paper's τ = 0.70, T = 4, 25 px guard).

    Raises:
        PolicyError: ``gt_mask`` is not 2-D.
    """

    def __init__(self, gt_mask: np.ndarray, clicker=None) -> None:
        from monailabel_xflow.policy.oracle import OracleClicker

        gt = np.asarray(gt_mask)
        if gt.ndim != 2:
            raise PolicyError(f"gt_mask must be (H, W), got shape {gt.shape}")
        self.gt = gt.astype(bool)
        self.clicker = clicker if clicker is not None else OracleClicker()

    def start(self, image: np.ndarray, instruction: Instruction, box: Box) -> _OracleSession:
        return _OracleSession(self)


_ORACLE_REASONS = {
    "tau": "The mask follows the lesion.",
    "T": "The click budget is spent.",
    "no-click": "No click can improve the mask.",
}


@dataclass
class _OracleSession:
    policy: OracleRevisionPolicy

    def step(self, state: RevisionState) -> str:
        mask = np.asarray(state.mask, dtype=bool)
        if mask.shape != self.policy.gt.shape:
            raise PolicyError(f"mask shape {mask.shape} differs from the ground truth's "
                              f"{self.policy.gt.shape}")
        click, reason = self.policy.clicker.decide(mask, self.policy.gt, list(state.clicks))
        if click is None:
            return format_stage2(Stage2Action(None, _ORACLE_REASONS.get(reason, "")))
        think = ("The mask misses part of the lesion." if click.positive
                 else "The mask covers tissue outside the lesion.")
        return format_stage2(Stage2Action(click, think))
