"""π_init (Stage 1) and π_rev (Stage 2) as one Gemma 3 vision-language model (paper §4):
MedGemma-1.5-4B-it in the paper, with the two policies as peft LoRA adapters,
``"init"`` and ``"rev"``, on one shared base model.

The conversations are encoded by :class:`~monailabel_xflow.policy.conversation.ConversationEncoder`,
the same code SFT and GRPO use, so training sees the token ids inference feeds the model.

Stage 2 reuses the key/value cache of the previous turn instead of re-reading the conversation:
the next turn's token ids are *appended* to the previous ``generate`` output (never
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from monailabel_xflow.geometry import Box, Click, box_to_view, check_image
from monailabel_xflow.instructions import Instruction, parse_instruction
from monailabel_xflow.policy.base import PolicyError, RevisionState, check_stop_bias
from monailabel_xflow.policy.conversation import IMAGE_TOKEN_TYPE, ConversationEncoder, Piece
from monailabel_xflow.policy.targets import init_target, revision_target
from monailabel_xflow.vocabulary import LEFT_LUNG
from monailabel_xflow.weights import choose_device, choose_dtype, looks_like_local_path

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel

__all__ = [
    "GenerationSettings",
    "VLMPolicy",
    "VLMRevisionSession",
    "INIT_ADAPTER",
    "REV_ADAPTER",
    "presence_decision_ids",
    "stop_decision_ids",
]

log = logging.getLogger(__name__)

INIT_ADAPTER = "init"
"""peft adapter name of π_init."""
REV_ADAPTER = "rev"
"""peft adapter name of π_rev."""


MIN_TRANSFORMERS = "5.24"
"""The oldest transformers the policy runs on: 5.24 named the KV cache ``cache`` (``generate(cache=)``
and ``output.cache``), which Stage 2 reuses across turns. ``setup.cfg`` requires the same."""


def check_transformers(version: str | None = None) -> None:
    """Refuse a transformers release older than :data:`MIN_TRANSFORMERS`.

    Args:
        version: the version to check (default: the installed one).

    Raises:
        PolicyError: naming both versions, before any model is loaded (an older release would
            fail deep inside ``generate`` with an AttributeError).
    """
    from packaging.version import Version

    if version is None:
        import transformers

        version = transformers.__version__
    if Version(version) < Version(MIN_TRANSFORMERS):
        raise PolicyError(
            f"the XFlow policy needs transformers>={MIN_TRANSFORMERS}, found {version}: "
            f"pip install 'transformers>={MIN_TRANSFORMERS},<6'"
        )


def _parting_index(ids: Sequence[int], others: Sequence[Sequence[int]]) -> int | None:
    """The first position at which ``ids`` holds a token none of ``others`` holds there (None: none)."""
    for k, token in enumerate(ids):
        if all(len(o) <= k or o[k] != token for o in others):
            return k
    return None


def stop_decision_ids(tokenizer) -> tuple[int, ...]:
    """Token ids of π_rev's stop answer up to the token where it parts from every click answer.

    π_rev decides in its think (``policy.targets.revision_target``): "The mask fits…" before a
    stop, "The mask misses…" / "spills…" before a click. The last id returned is the token that
    makes that choice; the ones before it are the context in which it does.

    Raises:
        PolicyError: the tokenizer renders the stop answer as a prefix of a click answer.
    """

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    stop = ids(revision_target(None))
    clicks = [ids(revision_target(Click(positive, 0.5, 0.5))) for positive in (True, False)]
    k = _parting_index(stop, clicks)
    if k is None:
        raise PolicyError("the tokenizer does not tell π_rev's stop answer from its clicks")
    return tuple(stop[: k + 1])


def presence_decision_ids(tokenizer) -> tuple[int, ...]:
    """Token ids of π_init's "absent" choice: the token where its think parts from a "present"
    one, after the token before it.

    π_init decides in its think (``policy.targets.init_target``): "…look for edema in the left
    lung: none." before an absent answer, "…: 1 region(s)." before a present one. The words
    before the choice name the question's finding and regions, so the context kept is the one
    token before it (the colon), which the bias then needs to fire.

    Raises:
        PolicyError: the tokenizer renders the absent think as a prefix of the present one.
    """
    instruction = parse_instruction("Segment the edema in the left lung.")
    lungs = {LEFT_LUNG: (0.5, 0.1, 0.9, 0.9)}
    lesion = np.zeros((64, 64), bool)
    lesion[16:32, 40:56] = True  # one component, well above geometry.MIN_COMPONENT_PX

    def ids(mask: np.ndarray | None) -> list[int]:
        return list(tokenizer(init_target(instruction, mask, lungs), add_special_tokens=False)["input_ids"])

    absent = ids(None)
    k = _parting_index(absent, [ids(lesion)])
    if not k:  # None, or parting at the first token: no context to fire on
        raise PolicyError("the tokenizer does not tell π_init's absent answer from a present one")
    return tuple(absent[k - 1 : k + 1])


# --- the VLM --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
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
        if not isinstance(self.do_sample, bool):
            raise PolicyError(f"do_sample must be True or False, got {self.do_sample!r}")
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
        zoom: π_rev looks at a zoomed view around the box that prompted the mask
            (``geometry.zoom_view``) instead of the whole image, and reads and writes its box and
            clicks in the view's coordinates; it must be the view the adapter was trained on.
        stop_bias: logits added to π_rev's choice to stop (:func:`stop_decision_ids`), at every
            Stage 2 turn; 0 decodes as trained.
        presence_bias: logits added to π_init's choice to answer "absent"
            (:func:`presence_decision_ids`); negative values make Stage 1 answer "present" more
            often (an operating point chosen on a dev set); 0 decodes as trained.

    Not thread-safe: the active adapter is state of the shared model. Each revision session
    keeps its own KV cache (built under "rev") until it is dropped.
    """

    def __init__(
        self,
        model,
        processor,
        generation: GenerationSettings | None = None,
        reuse_cache: bool = True,
        batch_stage1: bool = True,
        zoom: bool = False,
        stop_bias: float = 0.0,
        presence_bias: float = 0.0,
    ) -> None:
        check_transformers()
        self.model = model
        self.zoom = bool(zoom)
        self.stop_bias = check_stop_bias(stop_bias)
        self.presence_bias = check_stop_bias(presence_bias, "presence_bias")
        self.processor = processor
        self.generation = generation or GenerationSettings()
        self.reuse_cache = reuse_cache
        self.batch_stage1 = batch_stage1
        self.encoder = ConversationEncoder(processor)
        tok = processor.tokenizer
        # transformers' sequence_bias per stage: the decision token each stage's bias moves
        self._decision_bias: dict[str, list] = {}
        if self.stop_bias:
            self._decision_bias[REV_ADAPTER] = [[list(stop_decision_ids(tok)), self.stop_bias]]
        if self.presence_bias:
            self._decision_bias[INIT_ADAPTER] = [[list(presence_decision_ids(tok)), self.presence_bias]]
        # Image placeholders are never a valid answer; a near-flat policy sampling one would
        # break the next forward ("image features and image tokens do not match").
        config = getattr(model, "config", None)
        image_ids = [getattr(config, k, None) for k in ("image_token_id", "boi_token_id", "eoi_token_id")]
        image_ids += [
            tok.convert_tokens_to_ids(t) for t in ("<image_soft_token>", "<start_of_image>", "<end_of_image>")
        ]
        self._suppress_ids = sorted({int(i) for i in image_ids if isinstance(i, int) and i != tok.unk_token_id})
        self.adapters: frozenset[str] = frozenset(getattr(model, "peft_config", {}) or {})
        # Smallest sliding attention window (None: every layer attends to the whole sequence).
        text_config = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
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
        zoom: bool = False,
        stop_bias: float = 0.0,
        presence_bias: float = 0.0,
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
            generation, reuse_cache, batch_stage1, zoom, stop_bias, presence_bias: see the class.

        Raises:
            PolicyError: a local path that does not exist, or a transformers older than
                :data:`MIN_TRANSFORMERS`.
        """
        check_transformers()
        from transformers import AutoModelForImageTextToText, AutoProcessor

        for name, p in (("base", base), ("init_adapter", init_adapter), ("rev_adapter", rev_adapter)):
            if p is not None and looks_like_local_path(p) and not Path(p).exists():
                raise PolicyError(f"{name} folder {p} does not exist")
        torch_device = choose_device(device)
        dtype = choose_dtype(torch_device, dtype)
        t0 = time.perf_counter()
        processor = AutoProcessor.from_pretrained(str(base))
        base_model = AutoModelForImageTextToText.from_pretrained(str(base), dtype=dtype)
        model: PreTrainedModel | PeftModel = base_model
        adapters = [(INIT_ADAPTER, init_adapter), (REV_ADAPTER, rev_adapter)]
        adapters = [(n, p) for n, p in adapters if p is not None]
        if adapters:
            from peft import PeftModel

            (name, p), rest = adapters[0], adapters[1:]
            peft_model = PeftModel.from_pretrained(base_model, str(p), adapter_name=name, is_trainable=False)
            for name, p in rest:
                peft_model.load_adapter(str(p), adapter_name=name, is_trainable=False)
            model = peft_model
        # transformers wraps PreTrainedModel.to with functools.wraps(nn.Module.to): the stubs lose the bound self
        model.to(torch_device).eval()  # type: ignore[arg-type]
        log.info(
            "loaded policy model from %s (adapters: %s) in %.1f s",
            base,
            [n for n, _ in adapters] or "none",
            time.perf_counter() - t0,
        )
        return cls(
            model,
            processor,
            generation=generation,
            reuse_cache=reuse_cache,
            batch_stage1=batch_stage1,
            zoom=zoom,
            stop_bias=stop_bias,
            presence_bias=presence_bias,
        )

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

    def stage1_inputs(self, image: np.ndarray, instruction: Instruction) -> Piece:
        """Model inputs of the Stage 1 prompt, on the model's device."""
        return self.encoder.stage1_prompt(image, instruction).to(self.device, self.model.dtype)

    def generate(
        self,
        enc: Piece,
        cache=None,
        pixel_values=None,
        attention_mask=None,
        stage: str | None = None,
    ):
        """One ``generate`` call over the whole sequence so far.

        Args:
            enc: all token ids so far (those in ``cache`` included) and their token types.
            cache: a cache holding a prefix of ``enc`` (mutated in place), or None.
            pixel_values: pixels of exactly the images not yet in ``cache``.
            attention_mask: default all ones (no padding).
            stage: :data:`INIT_ADAPTER` (π_init's answers: ``presence_bias`` on the absent choice) or
                :data:`REV_ADAPTER` (π_rev's turns: ``stop_bias`` on the stop choice); None decodes
                unbiased (training rollouts).
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
            eos_token_id=self.encoder.stop_ids,
            pad_token_id=self.encoder.pad_id,
            suppress_tokens=self._suppress_ids or None,
            # dynamic (growable) cache always: a static one could not take the next turn
            cache_implementation=None,
            **settings.generate_kwargs(),
        )
        if pixel_values is not None:
            kwargs["pixel_values"] = pixel_values
        if stage in self._decision_bias:
            kwargs["sequence_bias"] = self._decision_bias[stage]
        if cache is not None:
            kwargs["cache"] = cache
        with torch.inference_mode():
            return self.model.generate(**kwargs)

    # -- Stage 1 ---------------------------------------------------------------------------------

    def stage1(self, image: np.ndarray, instruction: Instruction) -> str:
        """π_init's raw answer to one instruction (protocol text: lungs, presence, lesions)."""
        enc = self.stage1_inputs(image, instruction)
        with self._adapter(INIT_ADAPTER):
            out = self.generate(enc, pixel_values=enc.pixel_values, stage=INIT_ADAPTER)
        return self.encoder.decode(out.sequences[0, enc.input_ids.shape[1] :])

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
        encs = [e.to(self.device, self.model.dtype) for e in self.encoder.stage1_prompts(image, instructions)]
        prefix = _common_prefix_length([e.input_ids[0] for e in encs])
        prefix = min(prefix, min(e.input_ids.shape[1] for e in encs) - 1)
        image_pos = torch.nonzero(encs[0].token_type_ids[0] == IMAGE_TOKEN_TYPE)
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
                out = self.generate(enc, cache=branch, stage=INIT_ADAPTER)
                texts.append(self.encoder.decode(out.sequences[0, enc.input_ids.shape[1] :]))
        return texts

    def _continue_batched(self, encs: list[Piece], prefix: int, cache) -> list[str]:
        """One batched ``generate`` over all prompts, from the shared prefix ``cache``."""
        import torch

        n = len(encs)
        width = max(e.input_ids.shape[1] for e in encs) - prefix
        ids = torch.full((n, prefix + width), self.encoder.pad_id, dtype=torch.long, device=self.device)
        mask, tti = torch.zeros_like(ids), torch.zeros_like(ids)
        for row, enc in enumerate(encs):
            start = prefix + width - (enc.input_ids.shape[1] - prefix)  # pad between prefix and request
            for dst, src in ((ids, enc.input_ids), (tti, enc.token_type_ids)):
                dst[row, :prefix] = src[0, :prefix]
                dst[row, start:] = src[0, prefix:]
            mask[row, :prefix] = 1
            mask[row, start:] = 1
        cache.batch_repeat_interleave(n)
        out = self.generate(Piece(ids, tti, None), cache=cache, attention_mask=mask, stage=INIT_ADAPTER)
        return [self.encoder.decode(out.sequences[row, prefix + width :]) for row in range(n)]

    def _prefill(self, enc: Piece, length: int):
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
        check_image(image)  # the model sees the image through the observations (a checked image: free)
        x1, y1, x2, y2 = (float(v) for v in box)
        return VLMRevisionSession(self, instruction, (x1, y1, x2, y2))


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
        zoom: the policy's ``zoom`` (the loop renders the observation's view from it).
        texts: raw text of the model turns so far.
        input_ids: ``(1, N)`` ids of the whole conversation so far (None before step 0).
        token_type_ids: ``(1, N)`` their token types.
        pixel_values: ``(1, 3, S, S)`` per observation, in conversation order.
        answer_spans: ``[start, end)`` of each generated turn in ``input_ids`` (GRPO trains on
            these tokens only); the first span's start is where the opening prompt ends.
    """

    def __init__(self, policy: VLMPolicy, instruction: Instruction, box: Box) -> None:
        self.policy = policy
        self.instruction = instruction
        self.box = box
        self.zoom = policy.zoom
        self.texts: list[str] = []
        self.input_ids: torch.Tensor | None = None
        self.token_type_ids: torch.Tensor | None = None
        self.pixel_values: list = []
        self.answer_spans: list[tuple[int, int]] = []
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
        closes = self.input_ids is not None and int(self.input_ids[0, -1]) != p.encoder.end_of_turn
        box = box_to_view(self.box, state.view)  # the box as the observation shows it
        turn = p.encoder.stage2_prompt(
            state.observation, self.instruction, box, len(self.texts), closes_model_turn=closes
        ).to(p.device, p.model.dtype)
        if self.input_ids is None or self.token_type_ids is None:
            ids, tti = turn.input_ids, turn.token_type_ids
        else:
            ids = torch.cat([self.input_ids, turn.input_ids], dim=1)
            tti = torch.cat([self.token_type_ids, turn.token_type_ids], dim=1)
        self.pixel_values.append(turn.pixel_values)
        enc = Piece(ids, tti, None)
        with p._adapter(REV_ADAPTER):
            if p.reuse_cache:
                out = p.generate(enc, cache=self._cache, pixel_values=turn.pixel_values, stage=REV_ADAPTER)
                self._cache = out.cache
            else:
                out = p.generate(enc, pixel_values=torch.cat(self.pixel_values, dim=0), stage=REV_ADAPTER)
        new = out.sequences[:, ids.shape[1] :]
        self.answer_spans.append((ids.shape[1], out.sequences.shape[1]))
        self.input_ids = out.sequences
        self.token_type_ids = torch.cat([tti, torch.zeros_like(new)], dim=1)
        text_out = p.encoder.decode(new[0])
        self.texts.append(text_out)
        return text_out
