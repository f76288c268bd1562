"""ROSALIA sizes built in code: configs, an offline tokenizer, random models.

ROSALIA is LISA-7B fine-tuned on MIMIC-ILS: LLaVA (Llama + CLIP ViT-L/14 + a linear
``mm_projector``) and SAM ViT-H, joined by the ``[SEG]`` token. Here the same architecture is
built from transformers' own classes (``LlavaForConditionalGeneration``, ``SamModel``) at named
sizes (:data:`SIZES`):

* ``tiny``: a few hundred thousand parameters, for tests (milliseconds a question);
* ``demo``: ~3 M parameters, trained on phantoms (``xflow train rosalia-demo``);
* ``lisa-7b``: the real geometry (Llama-7B, CLIP ViT-L/14 at 224 px: 256 image tokens, SAM
  ViT-H at 1024 px), for configs and for loading the released checkpoint; never built in tests.

The tokenizer is trained offline (``tokenizers``), as in :mod:`monailabel_xflow.policy.configs`,
with Llama's special tokens (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2) and LISA's added tokens
(:data:`ADDED_TOKENS`: ``[SEG]``, ``<im_start>``, ``<im_end>``, plus ``<image>``, the placeholder
transformers' LLaVA replaces by image features).

LISA's projector is one ``nn.Linear``; transformers' LLaVA projector is
``linear_2(act(linear_1(x)))``. With ``projector_hidden_act="linear"`` (identity) the two are the
same function, and a released projector maps to ``linear_1`` with ``linear_2`` the identity
(:mod:`monailabel_xflow.rosalia.checkpoint`).

Heavy imports (torch, transformers, tokenizers) happen inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monailabel_xflow.rosalia.templates import IM_END, IM_START, IMAGE_TOKEN, SEG_TOKEN

__all__ = [
    "RosaliaTrainConfig",
    "SEG_TOKEN",
    "IM_START",
    "IM_END",
    "IMAGE_TOKEN",
    "ADDED_TOKENS",
    "SPECIAL_TOKENS",
    "SIZES",
    "build_tokenizer",
    "llava_config",
    "sam_config",
    "build_random_rosalia",
]

ADDED_TOKENS: tuple[str, ...] = (SEG_TOKEN, IM_START, IM_END, IMAGE_TOKEN)
"""Tokens LISA adds to Llama's vocabulary, in its order (``[SEG]`` first, then the image start /
end), then the image placeholder transformers' LLaVA needs."""
SPECIAL_TOKENS: tuple[str, ...] = ("<unk>", "<s>", "</s>")
"""Llama's special tokens with their ids 0, 1, 2."""

SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        text=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2
        ),
        clip=dict(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
        ),
        sam_vision=dict(
            image_size=64,
            patch_size=16,
            hidden_size=32,
            output_channels=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            mlp_dim=64,
            window_size=2,
            global_attn_indexes=[1],
            num_pos_feats=16,
        ),
        sam_decoder=dict(hidden_size=32, mlp_dim=64, num_attention_heads=2, iou_head_hidden_dim=32),
        lora_r=4,
    ),
    "demo": dict(
        text=dict(
            hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4
        ),
        clip=dict(
            image_size=128,
            patch_size=16,
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=3,
            num_attention_heads=4,
        ),
        sam_vision=dict(
            image_size=256,
            patch_size=16,
            hidden_size=96,
            output_channels=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            mlp_dim=384,
            window_size=8,
            global_attn_indexes=[1, 3],
            num_pos_feats=64,
        ),
        sam_decoder=dict(hidden_size=128, mlp_dim=512, num_attention_heads=4, iou_head_hidden_dim=128),
        lora_r=32,
    ),
    # LISA-7B: LLaVA-7B (Llama-7B; CLIP ViT-L/14, 224 px, layer -2, 256 patch tokens) + SAM ViT-H.
    "lisa-7b": dict(
        text=dict(
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
        ),
        clip=dict(
            image_size=224,
            patch_size=14,
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            projection_dim=768,
        ),
        sam_vision=dict(
            image_size=1024,
            patch_size=16,
            hidden_size=1280,
            output_channels=256,
            num_hidden_layers=32,
            num_attention_heads=16,
            mlp_dim=5120,
            window_size=14,
            global_attn_indexes=[7, 15, 23, 31],
            num_pos_feats=128,
        ),
        sam_decoder=dict(hidden_size=256, mlp_dim=2048, num_attention_heads=8, iou_head_hidden_dim=256),
        lora_r=128,
        vocab_size=32000,
    ),
}
"""Named sizes: Llama ``text`` fields, CLIP vision ``clip`` fields, SAM ``sam_vision`` and
``sam_decoder`` fields (the prompt encoder's width is the decoder's), ``lora_r`` (the paper's
LoRA rank is 128, alpha 256) and optionally ``vocab_size`` (Llama's 32,000 before LISA's tokens)."""


def _spec(size: str) -> dict[str, Any]:
    if size not in SIZES:
        raise ValueError(f"unknown ROSALIA size {size!r}; expected one of {sorted(SIZES)}")
    return SIZES[size]


def _corpus() -> list[str]:
    """What ROSALIA reads and writes: the llava_v1 system line, instructions, phrasings, answers."""
    from monailabel_xflow import vocabulary as v
    from monailabel_xflow.instructions import Instruction, phrasings
    from monailabel_xflow.rosalia.templates import SEG, SYSTEM, rosalia_answer

    questions = [Instruction(f, kind="global") for f in v.FINDINGS]
    questions += [Instruction(f, (r,)) for f in v.FINDINGS if f != "cardiomegaly" for r in v.LUNGS + v.ALL_ZONES]
    questions += [Instruction("cardiomegaly", (v.HEART,))]
    questions += [Instruction("opacity", (r,), kind="lesion_inference") for r in v.LUNGS + v.ALL_ZONES]
    texts = [SYSTEM, "USER: ", " ASSISTANT:"]
    for q in questions:
        texts += phrasings(q) + [rosalia_answer(q.absent_answer()), SEG]
    texts += [Instruction.located_answer((z,)) for z in v.REGIONS]
    texts += [Instruction.lesion_answer(t, c) for t in v.LESION_INFERENCE_TARGETS for c in (True, False)]
    return texts


def build_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE tokenizer with Llama's special tokens and LISA's added tokens.

    Returns:
        ``transformers.PreTrainedTokenizerFast``: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2 (bos / eos;
        ``pad`` = ``unk`` as in LISA), the BPE vocabulary, then :data:`ADDED_TOKENS` (single tokens,
        never split). No post-processor: prompts are built with their ``<s>`` by
        :mod:`monailabel_xflow.rosalia.templates`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_special_tokens(list(ADDED_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<unk>",
    )


def llava_config(size: str = "tiny", tokenizer=None):
    """``LlavaConfig`` (Llama text, CLIP vision, identity-activation projector) for a size.

    Args:
        size: a :data:`SIZES` key.
        tokenizer: the tokenizer the model uses (default :func:`build_tokenizer`); its length
            (at least the size's ``vocab_size``) and the ``<image>`` / special ids come from it.
    """
    from transformers import LlavaConfig

    spec = _spec(size)
    tok = tokenizer if tokenizer is not None else build_tokenizer()
    clip = spec["clip"]
    text_config = dict(
        model_type="llama",
        vocab_size=max(len(tok), spec.get("vocab_size", 0)),
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **spec["text"],
    )
    vision_config = dict(model_type="clip_vision_model", **clip)
    return LlavaConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=(clip["image_size"] // clip["patch_size"]) ** 2,
        projector_hidden_act="linear",
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        tie_word_embeddings=False,
    )


def sam_config(size: str = "tiny"):
    """``SamConfig`` for a size: ViT encoder, prompt encoder and single-/multi-mask decoder."""
    from transformers import SamConfig, SamMaskDecoderConfig, SamPromptEncoderConfig, SamVisionConfig

    spec = _spec(size)
    vision = SamVisionConfig(**spec["sam_vision"])
    decoder = SamMaskDecoderConfig(**spec["sam_decoder"])
    prompt = SamPromptEncoderConfig(
        hidden_size=decoder.hidden_size, image_size=vision.image_size, patch_size=vision.patch_size
    )
    return SamConfig(
        vision_config=vision.to_dict(), prompt_encoder_config=prompt.to_dict(), mask_decoder_config=decoder.to_dict()
    )


def build_random_rosalia(path: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """A randomly initialised ROSALIA of a :data:`SIZES` entry, saved as a ROSALIA folder.

    The folder loads with :meth:`monailabel_xflow.rosalia.model.RosaliaModel.from_pretrained`
    and :meth:`monailabel_xflow.rosalia.predictor.RosaliaPredictor.from_pretrained`.

    Args:
        path: output folder (created).
        size: ``"tiny"`` or ``"demo"`` (``"lisa-7b"`` works but needs ~30 GB).
        seed: torch seed; the same seed writes the same weights.
    """
    import torch

    from monailabel_xflow.rosalia.model import RosaliaModel

    tok = build_tokenizer()
    torch.manual_seed(seed)
    model = RosaliaModel.from_configs(llava_config(size, tok), sam_config(size), tok, size=size)
    model.save_pretrained(path)
    return Path(path)


@dataclass
class RosaliaTrainConfig:
    """Hyperparameters; the defaults are the paper's, except ``steps`` / ``batch`` (CPU-sized).

    Attributes:
        steps: optimiser steps (the paper: 15 epochs at batch 256).
        batch: rows per step.
        lr, warmup, betas, weight_decay, clip: AdamW and schedule (peak lr, linear warm-up / decay).
        lora_r, lora_alpha, lora_dropout: the language model's LoRA.
        equalize_p: probability of histogram equalisation per training image.
        phrase: ask the builders' phrasings (False: canonical instructions only).
        train_vision: also train CLIP and the projector (not in the paper; for random-init sizes).
        train_sam_encoder: also train SAM's image encoder (not in the paper; for random-init sizes,
            whose encoder is not a pretrained SAM).
        seed: data order, negatives, equalisation draws, LoRA init.
    """

    steps: int = 1000
    batch: int = 8
    lr: float = 3e-4
    warmup: int = 100
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    clip: float = 1.0
    lora_r: int = 128
    lora_alpha: int = 256
    lora_dropout: float = 0.05
    equalize_p: float = 0.5
    phrase: bool = True
    train_vision: bool = False
    train_sam_encoder: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        from monailabel_xflow.training.config import check_int_fields

        check_int_fields(self, ("steps", "batch", "lora_r", "lora_alpha"))
