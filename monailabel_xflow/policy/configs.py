"""Small random Gemma3 vision-language models, built offline, for tests, benchmarks and demos.

The XFlow policies are MedGemma-1.5-4B-it (``Gemma3ForConditionalGeneration``) with two LoRA
adapters. Nothing here downloads anything: the tokenizer is trained in code with the
``tokenizers`` library, the model is built from a small config with random weights, and both are
saved in Hugging Face format so that :class:`monailabel_xflow.policy.vlm.VLMPolicy` loads them
through the same code path a user's real checkpoint takes.

Choices that matter:

* **Digits are single tokens** (``pre_tokenizers.Digits(individual_digits=True)`` before
  ``ByteLevel``), so a text coordinate ``(123,456)`` is always ``( 1 2 3 , 4 5 6 )``.
* **Protocol tags** (:data:`PROTOCOL_TAGS`) are single added tokens, *not* special tokens:
  ``decode(..., skip_special_tokens=True)`` keeps them, so the raw text the policies return can
  be parsed by :mod:`monailabel_xflow.policy.protocol`.
* **Gemma3 special tokens** (:data:`SPECIAL_TOKENS`) have the ids Gemma uses for the first four
  (``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3); ``eos_token_id`` of the generation
  config is ``[<eos>, <end_of_turn>]`` so a turn stops at the end of the model's turn.
* **The multimodal projection is randomised**: a freshly initialised Gemma3 has a zero
  ``mm_input_projection_weight``, so images would have no effect at all in a toy model.

Heavy imports (torch, transformers, tokenizers, peft) happen inside the functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from monailabel_xflow.policy.protocol import TAGS as PROTOCOL_TAGS

__all__ = [
    "PROTOCOL_TAGS",
    "SPECIAL_TOKENS",
    "CHAT_TEMPLATE",
    "SIZES",
    "LORA_TARGET_MODULES",
    "RandomVLM",
    "build_tokenizer",
    "build_processor",
    "gemma3_config",
    "build_random_vlm",
]

SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
"""Gemma3 special tokens; the first four get ids 0-3 as in Gemma."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
"""Gemma3-style chat template (roles ``user`` / ``model``; ``system`` is rendered as its own
turn, unlike Gemma's, which folds it into the first user turn; the policies do not use one)."""

SIZES: dict[str, dict[str, Any]] = {
    # ~0.2 M parameters: small enough for the unit tests to call generate freely.
    # Layer 0 uses a sliding window of 24 tokens so that a 4-turn conversation (6 image tokens
    # a turn) runs past it: cache reuse must stay exact there too.
    "tiny": dict(
        image_size=32,
        patch_size=8,
        mm_tokens_per_image=4,
        vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
        text=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            sliding_window=24,
            layer_types=["sliding_attention", "full_attention"],
        ),
        lora_r=4,
    ),
    # Several hundred million parameters (mostly the language model): big enough that
    # re-reading a conversation costs real time on a CPU, for benchmarks/bench_policy.py.
    # Narrower and shallower than MedGemma-4B, but with its 256 tokens per image (SigLIP at
    # 224 px / patch 14 = 16 x 16 patches, unpooled): they set how fast a Stage 2 conversation
    # grows, which is what cache reuse saves.
    "mid": dict(
        image_size=224,
        patch_size=14,
        mm_tokens_per_image=256,
        vision=dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=6),
        text=dict(
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=12,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=128,
            sliding_window=512,
        ),
        lora_r=16,
    ),
    # The shapes of MedGemma-1.5-4B-it (Gemma 3 4B: SigLIP-so400m at 896 px pooled to 256
    # tokens, 34 text layers 2560 wide, 262,208-token vocabulary; 4.3 B parameters, 8.6 GB in
    # bf16) with random weights, for latency benchmarks of the real architecture
    # (benchmarks/bench_workflow.py --vlm medgemma-4b). Build it with dtype="bfloat16".
    "medgemma-4b": dict(
        image_size=896,
        patch_size=14,
        mm_tokens_per_image=256,
        vision=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16),
        text=dict(
            hidden_size=2560,
            intermediate_size=10240,
            num_hidden_layers=34,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            sliding_window=1024,
        ),
        lora_r=128,
        vocab_size=262_208,
    ),
}
"""Named model sizes for :func:`gemma3_config` / :func:`build_random_vlm`: ``image_size``,
``patch_size``, ``mm_tokens_per_image``, ``vision`` / ``text`` config fields (without
``layer_types`` the text config takes Gemma 3's own: every sixth layer full attention, the
others sliding-window), ``lora_r`` and,
optionally, ``embedding_std`` (std of the random tied embeddings; default the config's 0.02)
and ``vocab_size`` (rows of the embedding / output matrix, at least the tokenizer's; a real
vocabulary's size makes the output layer cost what it costs in the real model)."""

LORA_TARGET_MODULES = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
"""Regex restricting LoRA to the language model's linear layers. Plain module names would also
catch SigLIP's ``q_proj``/``k_proj``/... in the vision tower."""


class RandomVLM(NamedTuple):
    """Folders written by :func:`build_random_vlm`."""

    base: Path
    """Base model + processor (``AutoModelForImageTextToText`` / ``AutoProcessor``)."""
    init: Path | None
    """LoRA adapter of π_init (peft format), or None."""
    rev: Path | None
    """LoRA adapter of π_rev (peft format), or None."""


def _corpus() -> list[str]:
    """Text the byte-level BPE is trained on: what the policies read and write.

    The prompts of both stages for every finding and region, the ways builders phrase
    questions, the Stage 1 and Stage 2 targets and the answer sentences. Trained on these, the
    tokenizer keeps their words whole, as Gemma's 262k-token vocabulary does: prompt lengths
    (and so prefill and cache costs in tests and benchmarks) are those a real checkpoint sees,
    not the ~2x of a near character-level split.
    """
    import numpy as np

    from monailabel_xflow import vocabulary as v
    from monailabel_xflow.geometry import Click
    from monailabel_xflow.instructions import Instruction, phrasings
    from monailabel_xflow.policy import prompts as p
    from monailabel_xflow.policy import targets as b

    questions = [Instruction(f, kind="global") for f in v.FINDINGS]
    questions += [Instruction(f, (r,)) for f in v.FINDINGS if f != "cardiomegaly" for r in v.LUNGS + v.ALL_ZONES]
    questions += [Instruction("cardiomegaly", (v.HEART,))]
    questions += [Instruction("opacity", (r,), kind="lesion_inference") for r in v.LUNGS]
    lungs = {lung: (0.1, 0.1, 0.5, 0.9) for lung in v.LUNGS}
    lesion = np.pad(np.ones((8, 8), bool), 8)
    texts = [p.STAGE1_PREAMBLE, p.STAGE2_PREAMBLE, p.STAGE2_FOLLOWUP, "\n\n", "\n\n\n"]
    for q in questions:
        texts += [p.stage1_request(q), p.stage2_request(q, (0.25, 0.5, 0.45, 0.75)), q.absent_answer()]
        texts += phrasings(q)
        texts += [b.init_target(q, None, lungs), b.init_target(q, lesion, lungs)]
    texts += [Instruction.located_answer((z,)) for z in v.ALL_ZONES]
    texts += [Instruction.lesion_answer(t, c) for t in v.LESION_INFERENCE_TARGETS for c in (True, False)]
    texts += [b.revision_target(None)] + [b.revision_target(Click(s, 0.3, 0.4)) for s in (True, False)]
    return texts


def build_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE tokenizer with Gemma3's special tokens and the protocol tags.

    Args:
        vocab_size: target vocabulary size of the BPE model (added tokens come on top).

    Returns:
        ``transformers.PreTrainedTokenizerFast`` with ``bos/eos/pad/unk`` set, Gemma3's
        ``boi_token`` / ``eoi_token`` / ``image_token`` attributes (what ``Gemma3Processor``
        reads), the chat template, and ``add_bos_token`` semantics left to the template
        (the post-processor adds nothing).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # Tags are ordinary added tokens: never split, but kept by skip_special_tokens=True.
    tok.add_tokens(list(PROTOCOL_TAGS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        boi_token="<start_of_image>",
        eoi_token="<end_of_image>",
        image_token="<image_soft_token>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        chat_template=CHAT_TEMPLATE,
    )
    return fast


def build_processor(size: str = "tiny"):
    """``Gemma3Processor`` (PIL image processor, offline tokenizer) matching a :data:`SIZES` entry.

    The image processor resizes to the model's square ``image_size``, rescales to ``[0, 1]`` and
    normalises with mean = std = 0.5 (Gemma3's defaults); every image becomes
    ``mm_tokens_per_image`` soft tokens.
    """
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    spec = _spec(size)
    image_processor = Gemma3ImageProcessorPil(
        size={"height": spec["image_size"], "width": spec["image_size"]},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return Gemma3Processor(
        image_processor=image_processor,
        tokenizer=build_tokenizer(),
        chat_template=CHAT_TEMPLATE,
        image_seq_length=spec["mm_tokens_per_image"],
    )


def _spec(size: str) -> dict[str, Any]:
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; expected one of {sorted(SIZES)}")
    return SIZES[size]


def gemma3_config(size: str = "tiny", tokenizer=None):
    """A ``Gemma3Config`` for a :data:`SIZES` entry, wired to ``tokenizer``'s special-token ids.

    Args:
        size: a :data:`SIZES` key (``"tiny"``, ``"mid"``, ``"medgemma-4b"``, ...).
        tokenizer: the tokenizer the model will use (default: :func:`build_tokenizer`); the
            vocabulary size and the image / pad / bos / eos ids come from it.
    """
    from transformers import Gemma3Config

    spec = _spec(size)
    tok = tokenizer if tokenizer is not None else build_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = dict(spec["text"])
    head_dim = text["head_dim"]
    text_config = dict(
        model_type="gemma3_text",
        vocab_size=max(len(tok), spec.get("vocab_size", 0)),
        max_position_embeddings=4096,
        query_pre_attn_scalar=head_dim,
        pad_token_id=ids["<pad>"],
        bos_token_id=ids["<bos>"],
        eos_token_id=ids["<eos>"],
        **text,
    )
    vision_config = dict(
        model_type="siglip_vision_model",
        image_size=spec["image_size"],
        patch_size=spec["patch_size"],
        **spec["vision"],
    )
    # transformers 5 declares Gemma3Config's own fields only; PreTrainedConfig's token ids still
    # go through as keyword arguments at run time (the saved config.json holds them)
    return Gemma3Config(  # type: ignore[call-arg]
        text_config=text_config,
        vision_config=vision_config,
        mm_tokens_per_image=spec["mm_tokens_per_image"],
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
        pad_token_id=ids["<pad>"],
        bos_token_id=ids["<bos>"],
        eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]],
        tie_word_embeddings=True,
    )


def build_random_vlm(
    path: str | Path,
    size: str = "tiny",
    seed: int = 0,
    adapters: bool = True,
    dtype: str | None = None,
) -> RandomVLM:
    """Build a random ``Gemma3ForConditionalGeneration`` and save it like a real checkpoint.

    Writes ``path/base`` (model weights, config, generation config, processor) and, with
    ``adapters=True``, two peft LoRA adapters ``path/init`` and ``path/rev`` (adapter names
    "init" and "rev"). The adapters are randomly initialised (``init_lora_weights=False``) with
    different seeds so that π_init and π_rev really differ; they target only the language
    model's linear layers (:data:`LORA_TARGET_MODULES`), rank ``SIZES[size]["lora_r"]``.

    Args:
        path: output folder (created).
        size: ``"tiny"`` (tests), ``"mid"`` or ``"medgemma-4b"`` (benchmarks).
        seed: torch seed of the weights; the same seed writes the same model.
        adapters: whether to write the two adapters.
        dtype: torch dtype name the weights are created and saved in (default float32);
            ``"bfloat16"`` halves the memory a large size needs while it is built.

    Returns:
        :class:`RandomVLM` with the folders written (``init``/``rev`` None without adapters).
    """
    import torch
    from transformers import Gemma3ForConditionalGeneration, GenerationConfig

    path = Path(path)
    spec = _spec(size)
    processor = build_processor(size)
    config = gemma3_config(size, processor.tokenizer)
    torch.manual_seed(seed)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype) if dtype else default_dtype)
    try:
        model = Gemma3ForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    # A fresh Gemma3 zeroes this projection (images would not matter): randomise it, scaled so
    # projected image tokens have roughly unit variance like the text embeddings after RMSNorm.
    proj = model.model.multi_modal_projector.mm_input_projection_weight
    with torch.no_grad():
        proj.normal_(0.0, proj.shape[0] ** -0.5)
        if "embedding_std" in spec:
            # Tied embeddings are also the output layer, and LoRA leaves them frozen: at the default
            # std 0.02 a 128-wide model's logits span ~2.5 at most, so its answers stay near-uniform
            # (cross-entropy ~4 at 90 % token accuracy) and sampled rollouts are noise.
            model.get_input_embeddings().weight.normal_(0.0, spec["embedding_std"])
    eos = config.eos_token_id
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        pad_token_id=config.pad_token_id,
        eos_token_id=eos,
        do_sample=False,
        max_new_tokens=64,
    )
    base = path / "base"
    model.save_pretrained(base)
    processor.save_pretrained(base)
    if not adapters:
        return RandomVLM(base, None, None)

    from peft import LoraConfig, get_peft_model

    def lora() -> LoraConfig:
        return LoraConfig(
            r=spec["lora_r"],
            lora_alpha=2 * spec["lora_r"],
            lora_dropout=0.0,
            target_modules=LORA_TARGET_MODULES,
            init_lora_weights=False,
        )

    torch.manual_seed(seed + 1)  # the adapters' random initialisation happens on injection
    peft_model = get_peft_model(model, lora(), adapter_name="init")
    torch.manual_seed(seed + 2)
    peft_model.add_adapter("rev", lora())
    # Non-default adapters are saved in subfolders named after them: path/init, path/rev.
    peft_model.save_pretrained(str(path))
    _check_adapter_folder(path / "init")
    _check_adapter_folder(path / "rev")
    return RandomVLM(base, path / "init", path / "rev")


def _check_adapter_folder(folder: Path) -> None:
    cfg = folder / "adapter_config.json"
    if not cfg.is_file():
        raise RuntimeError(f"peft did not write {cfg}")
    json.loads(cfg.read_text())
