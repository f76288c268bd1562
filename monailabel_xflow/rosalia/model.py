"""ROSALIA as a model: transformers' LLaVA + SAM joined by the ``[SEG]`` token.

:class:`RosaliaModel` holds

* ``llava``: ``LlavaForConditionalGeneration`` (Llama, CLIP vision tower, projector);
* ``sam``: ``SamModel`` (ViT image encoder, prompt encoder, mask decoder);
* ``text_hidden_fcs``: LISA's projection MLP ``Linear(h, h) -> ReLU -> Linear(h, d) -> Dropout(0)``
  from the language model's last hidden state to one SAM sparse prompt embedding (``d`` = the
  prompt encoder's width, 256 for SAM ViT-H).

The ``[SEG]`` embedding is taken where LISA's code takes it: ``seg_token_mask = input_ids[:, 1:]
== seg_token_idx`` selects the last hidden state at the position *before* each ``[SEG]``, the one
whose output predicts it. ROSALIA's answers start with ``[SEG]``, so that position is the prompt's
last (``ASSISTANT:``): the mask depends on the image and the question, not on the sentence after.
The embedding is SAM's only sparse prompt (no points, no box); the dense prompt is SAM's
``no_mask_embed``; the decoder runs single-mask; prediction = logits > 0.

Model input (:class:`RosaliaEncoder`, shared by training and inference):

* SAM branch: grey -> RGB uint8, ResizeLongestSide(S) (bilinear, antialiased), normalise with
  SAM's pixel mean (123.675, 116.28, 103.53) / std (58.395, 57.12, 57.375), pad bottom / right to
  S x S. Mask logits (``S/4`` square) are upsampled to S, cropped to the resized image and
  upsampled to the original (H, W) (SAM's ``postprocess_masks``).
* VLM branch: the CLIP image processor (resize shortest side, centre crop, CLIP normalisation).
* Histogram equalisation of the grey image (MONAI ``HistogramNormalize``, 256 bins): with
  probability 0.5 in training (the paper's recipe); not at inference, as in the public code
  (:class:`~monailabel_xflow.rosalia.predictor.RosaliaPredictor`).
* Text: :func:`~monailabel_xflow.rosalia.templates.reference_ids` (chunks around ``<image>``
  tokenised separately, as LISA's ``tokenizer_image_token``), ``<s>`` first; training appends
  the answer (:func:`~monailabel_xflow.rosalia.templates.rosalia_answer`) and ``</s>``, and the
  text loss is on those tokens only.

Folder layout written by :meth:`RosaliaModel.save_pretrained` (Hugging Face format)::

    rosalia.json                    format marker, size name, [SEG] token, equalisation (of
                                    training; inference does not), tokenisation
    llava/                          LlavaForConditionalGeneration.save_pretrained
    sam/                            SamModel.save_pretrained
    text_hidden_fcs.safetensors     the projection MLP ("0.weight", "0.bias", "2.weight", "2.bias")
    tokenizer.json, ...             the tokenizer (with [SEG], <im_start>, <im_end>, <image>)
    preprocessor_config.json        the CLIP image processor
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from monailabel_xflow.errors import InputError
from monailabel_xflow.rosalia.templates import SEG_TOKEN, TOKENISATIONS, reference_ids, whole_prompt_ids
from monailabel_xflow.segmenter.base import to_rgb01

FORMAT = "rosalia"
CONFIG_NAME = "rosalia.json"
FCS_NAME = "text_hidden_fcs.safetensors"
SAM_PIXEL_MEAN = (123.675, 116.28, 103.53)
SAM_PIXEL_STD = (58.395, 57.12, 57.375)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IGNORE_INDEX = -100

# The paper's loss weights (ROSALIA / LISA train_ds.py): text CE 0.5, mask BCE 5, mask Dice 1.
CE_WEIGHT, BCE_WEIGHT, DICE_WEIGHT = 0.5, 5.0, 1.0


class RosaliaError(InputError):
    """A folder that is not a ROSALIA model, or input the model cannot use."""


def text_hidden_fcs(in_dim: int, out_dim: int) -> nn.Sequential:
    """LISA's projection MLP (one element of its ``text_hidden_fcs`` ModuleList)."""
    return nn.Sequential(nn.Linear(in_dim, in_dim), nn.ReLU(inplace=True), nn.Linear(in_dim, out_dim), nn.Dropout(0.0))


def clip_processor(image_size: int):
    """CLIP's image processor (PIL backend) at ``image_size``: LLaVA-v1 / LISA's VLM branch."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    return CLIPImageProcessorPil(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        image_mean=list(CLIP_MEAN),
        image_std=list(CLIP_STD),
    )


def equalize(grey: np.ndarray) -> np.ndarray:
    """Histogram equalisation of an ``(H, W)`` uint8 image (MONAI ``HistogramNormalize``), uint8."""
    from monai.transforms import HistogramNormalize

    out = HistogramNormalize(num_bins=256, min=0, max=255)(grey.astype(np.float32))
    return np.clip(np.asarray(out), 0, 255).round().astype(np.uint8)


@dataclass
class EncodedImage:
    """One image prepared for both branches.

    Attributes:
        clip_pixels: ``(3, c, c)`` float32, the CLIP processor's output.
        sam_pixels: ``(3, S, S)`` float32, normalised and padded.
        resized: ``(h, w)`` of the image inside ``sam_pixels`` (before padding).
        original: ``(H, W)`` of the input.
    """

    clip_pixels: torch.Tensor
    sam_pixels: torch.Tensor
    resized: tuple[int, int]
    original: tuple[int, int]


@dataclass
class EncodedText:
    """Token ids of one prompt (and answer).

    Attributes:
        input_ids: ``(L,)`` long, ``<s>`` + prompt (+ answer + ``</s>`` in training).
        labels: ``(L,)`` long, ``-100`` on the prompt, the ids on the answer (None without one).
        prompt_length: number of prompt tokens; the ``[SEG]`` embedding of a training answer is the
            hidden state at ``prompt_length - 1``.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor | None
    prompt_length: int


class RosaliaEncoder:
    """Builds ROSALIA's input, the same way for training and inference (see the module docstring).

    Args:
        tokenizer: the model's tokenizer (holding ``[SEG]`` and the image tokens).
        image_tokens: image features per image (the CLIP patch count).
        clip_size: CLIP input size.
        sam_size: SAM input size S.
        tokenisation: one of :data:`~monailabel_xflow.rosalia.templates.TOKENISATIONS`:
            ``"reference"`` (the public code's, the default) or ``"whole-prompt"`` (models trained
            before it).

    Raises:
        RosaliaError: an unknown tokenisation.
    """

    def __init__(
        self, tokenizer, image_tokens: int, clip_size: int, sam_size: int, tokenisation: str = "reference"
    ) -> None:
        if tokenisation not in TOKENISATIONS:
            raise RosaliaError(f"unknown tokenisation {tokenisation!r}; one of {list(TOKENISATIONS)}")
        self.tokenisation = tokenisation
        self.tokenizer = tokenizer
        self.image_tokens = int(image_tokens)
        self.sam_size = int(sam_size)
        self.clip = clip_processor(clip_size)

    def image(self, image: np.ndarray, equalise: bool = False) -> EncodedImage:
        """Prepare an ``(H, W)`` / ``(H, W, 3)`` image (uint8, or float in [0, 1]).

        Raises:
            SegmenterInputError: an image of another shape or dtype, or with NaNs.
        """
        rgb = to_rgb01(image)
        if equalise:
            grey = np.round(rgb.mean(axis=-1) * 255.0).astype(np.uint8)
            rgb8 = np.repeat(equalize(grey)[..., None], 3, axis=-1)
        else:
            rgb8 = np.round(rgb * 255.0).astype(np.uint8)
        from PIL import Image

        clip_pixels = self.clip(images=Image.fromarray(rgb8), return_tensors="pt")["pixel_values"][0]
        h, w = rgb8.shape[:2]
        scale = self.sam_size / max(h, w)
        nh, nw = int(h * scale + 0.5), int(w * scale + 0.5)  # SAM's ResizeLongestSide rounding
        x = torch.from_numpy(rgb8).permute(2, 0, 1)[None].float()
        x = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)[0]
        x = x.clamp(0, 255).round()  # ResizeLongestSide resizes uint8 images
        x = (x - torch.tensor(SAM_PIXEL_MEAN)[:, None, None]) / torch.tensor(SAM_PIXEL_STD)[:, None, None]
        x = F.pad(x, (0, self.sam_size - nw, 0, self.sam_size - nh))
        return EncodedImage(clip_pixels.float(), x.float(), (nh, nw), (h, w))

    def text(self, instruction_text: str, answer_sentence: str | None = None) -> EncodedText:
        """Token ids of the prompt, plus ``[SEG] sentence</s>`` when ``answer_sentence`` is given
        (``""`` for a basic positive, whose answer is ``[SEG]`` alone)."""
        build = reference_ids if self.tokenisation == "reference" else whole_prompt_ids
        prompt_ids, answer_ids = build(self.tokenizer, instruction_text, self.image_tokens, answer_sentence)
        if answer_sentence is None:
            return EncodedText(torch.tensor(prompt_ids), None, len(prompt_ids))
        ids = torch.tensor(prompt_ids + answer_ids)
        labels = torch.tensor([IGNORE_INDEX] * len(prompt_ids) + answer_ids)
        return EncodedText(ids, labels, len(prompt_ids))


class RosaliaModel(nn.Module):
    """LLaVA + SAM + the projection MLP (see the module docstring).

    Args:
        llava: ``LlavaForConditionalGeneration``.
        sam: ``SamModel``.
        tokenizer: tokenizer holding ``[SEG]``.
        fcs: the projection MLP (default: a new one, ``text hidden -> prompt width``).
        meta: extra fields of ``rosalia.json`` (``size``...).
    """

    def __init__(self, llava, sam, tokenizer, fcs: nn.Module | None = None, meta: dict[str, Any] | None = None):
        super().__init__()
        self.llava = llava
        self.sam = sam
        self.tokenizer = tokenizer
        hidden = llava.config.text_config.hidden_size
        out_dim = sam.config.prompt_encoder_config.hidden_size
        self.text_hidden_fcs = fcs if fcs is not None else text_hidden_fcs(hidden, out_dim)
        self.meta = dict(meta or {})
        self.seg_token_id = tokenizer.convert_tokens_to_ids(SEG_TOKEN)
        if self.seg_token_id is None or self.seg_token_id == tokenizer.unk_token_id:
            raise RosaliaError(f"the tokenizer has no {SEG_TOKEN} token")
        vision = llava.config.vision_config
        self.meta.setdefault("tokenisation", "reference")
        self.encoder = RosaliaEncoder(
            tokenizer,
            llava.config.image_seq_length,
            vision.image_size,
            sam.config.vision_config.image_size,
            self.meta["tokenisation"],
        )

    # --- construction and storage -------------------------------------------------------------

    @classmethod
    def from_configs(cls, llava_config, sam_config, tokenizer, **meta) -> RosaliaModel:
        """A randomly initialised model (seed torch first for reproducible weights)."""
        from transformers import GenerationConfig, LlavaForConditionalGeneration, SamModel

        llava = LlavaForConditionalGeneration(llava_config).eval()
        llava.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            do_sample=False,
            max_new_tokens=32,
        )
        sam = SamModel(sam_config).eval()
        with torch.no_grad():  # released SAM has one Gaussian matrix (pe_layer) for both uses
            sam.prompt_encoder.shared_embedding.positional_embedding.copy_(
                sam.shared_image_embedding.positional_embedding
            )
        return cls(llava, sam, tokenizer, meta=meta).eval()

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> Path:
        """Write the folder layout of the module docstring; returns the folder.

        Args:
            dtype: store the weights in this dtype (e.g. ``torch.float16`` halves a committed
                demo); :meth:`from_pretrained` loads them as float32 unless told otherwise.
        """
        import copy

        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        llava, sam, fcs = self.llava, self.sam, self.text_hidden_fcs
        if dtype is not None:
            llava, sam, fcs = (copy.deepcopy(m).to(dtype) for m in (llava, sam, fcs))
        llava.save_pretrained(path / "llava")
        sam.save_pretrained(path / "sam")
        save_file({k: v.detach().contiguous() for k, v in fcs.state_dict().items()}, path / FCS_NAME)
        self.tokenizer.save_pretrained(path)
        self.encoder.clip.save_pretrained(path)
        (path / CONFIG_NAME).write_text(
            json.dumps({"format": FORMAT, "seg_token": SEG_TOKEN, "equalize": True, **self.meta}, indent=1) + "\n"
        )
        return path

    @classmethod
    def from_pretrained(
        cls, path: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None
    ) -> RosaliaModel:
        """Load a folder written by :meth:`save_pretrained` (or by the LISA converter).

        Raises:
            RosaliaError: not a ROSALIA folder (missing ``rosalia.json`` or parts).
        """
        from safetensors.torch import load_file
        from transformers import LlavaForConditionalGeneration, PreTrainedTokenizerFast, SamModel

        path = Path(path)
        cfg_path = path / CONFIG_NAME
        if not cfg_path.is_file():
            raise RosaliaError(
                f"{path} is not a ROSALIA model folder (no {CONFIG_NAME}); a released LISA/ROSALIA "
                "checkpoint is converted with monailabel_xflow.rosalia.checkpoint.convert_lisa_checkpoint"
            )
        meta = json.loads(cfg_path.read_text())
        if meta.get("format") != FORMAT:
            raise RosaliaError(f"{cfg_path} does not describe a ROSALIA model (format {meta.get('format')!r})")
        for part in ("llava", "sam", FCS_NAME):
            if not (path / part).exists():
                raise RosaliaError(f"{path} lacks {part}")
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        llava = LlavaForConditionalGeneration.from_pretrained(path / "llava", dtype=dtype or torch.float32)
        sam = SamModel.from_pretrained(path / "sam", dtype=dtype or torch.float32)
        fcs_state = load_file(path / FCS_NAME)
        hidden, out_dim = fcs_state["0.weight"].shape[1], fcs_state["2.weight"].shape[0]
        fcs = text_hidden_fcs(hidden, out_dim)
        fcs.load_state_dict(fcs_state)
        meta = {k: v for k, v in meta.items() if k not in ("format", "seg_token", "equalize")}
        meta.setdefault("tokenisation", "whole-prompt")  # saved before the key: trained that way
        model = cls(llava, sam, tokenizer, fcs.to(dtype or torch.float32), meta=meta).eval()
        return model.to(device) if device is not None else model

    @property
    def device(self) -> torch.device:
        return next(self.text_hidden_fcs.parameters()).device

    # --- the SAM half ---------------------------------------------------------------------------

    def image_embeddings(self, sam_pixels: torch.Tensor) -> torch.Tensor:
        """SAM image embeddings ``(B, d, e, e)`` of ``(B, 3, S, S)`` pixels."""
        return self.sam.get_image_embeddings(sam_pixels.to(self.device, self.sam.dtype))

    def decode_masks(self, image_embeddings: torch.Tensor, prompts: torch.Tensor) -> torch.Tensor:
        """Single-mask decoding of one ``[SEG]`` prompt per image.

        Args:
            image_embeddings: ``(B, d, e, e)``.
            prompts: ``(B, d)`` projected ``[SEG]`` embeddings.

        Returns:
            ``(B, S/4, S/4)`` low-resolution mask logits.
        """
        b = prompts.shape[0]
        sam = self.sam
        sparse = prompts.to(image_embeddings.dtype).reshape(b, 1, 1, -1)
        e = image_embeddings.shape[-1]
        dense = sam.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(b, -1, e, e)
        pe = sam.get_image_wide_positional_embeddings().repeat(b, 1, 1, 1)
        masks, _ = sam.mask_decoder(
            image_embeddings=image_embeddings,
            image_positional_embeddings=pe,
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            multimask_output=False,
        )
        return masks[:, 0, 0]

    def postprocess(self, low_res: torch.Tensor, resized: tuple[int, int], original: tuple[int, int]) -> torch.Tensor:
        """SAM's ``postprocess_masks`` for one mask: ``(s, s)`` logits -> ``(H, W)`` logits."""
        s = self.encoder.sam_size
        x = F.interpolate(low_res[None, None], size=(s, s), mode="bilinear", align_corners=False)
        x = x[..., : resized[0], : resized[1]]
        return F.interpolate(x, size=tuple(original), mode="bilinear", align_corners=False)[0, 0]

    # --- training -------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        clip_pixels: torch.Tensor,
        sam_pixels: torch.Tensor,
        seg_positions: torch.Tensor,
        masks: Sequence[torch.Tensor],
        resized: Sequence[tuple[int, int]],
        image_embeddings: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """The paper's training loss on a batch (one question, one ``[SEG]`` per row).

        Args:
            input_ids, attention_mask, labels: ``(B, L)`` right-padded (labels ``-100`` off the answer).
            clip_pixels: ``(B, 3, c, c)``.
            sam_pixels: ``(B, 3, S, S)`` (unused when ``image_embeddings`` is given).
            seg_positions: ``(B,)`` the hidden-state index of each row's ``[SEG]`` embedding.
            masks: B float ``(H, W)`` ground-truth masks (all zeros for a negative).
            resized: B ``(h, w)`` image sizes inside the SAM input.
            image_embeddings: precomputed SAM embeddings (a frozen encoder's can be cached).

        Returns:
            ``loss`` = 0.5 CE + 5 BCE + 1 Dice, and each term (``ce``, ``bce``, ``dice``) detached.
            BCE is the per-pixel mean over every row; Dice (sigmoid, scale 1000, eps 1e-6) is the
            mean over rows with a non-empty mask only (ROSALIA's change to LISA).
        """
        dev = self.device
        out = self.llava(
            input_ids=input_ids.to(dev),
            attention_mask=attention_mask.to(dev),
            pixel_values=clip_pixels.to(dev, self.llava.dtype),
            labels=labels.to(dev),
            output_hidden_states=True,
        )
        hidden = out.hidden_states[-1]
        rows = torch.arange(hidden.shape[0], device=dev)
        prompts = self.text_hidden_fcs(hidden[rows, seg_positions.to(dev)])
        emb = image_embeddings.to(dev) if image_embeddings is not None else self.image_embeddings(sam_pixels)
        low = self.decode_masks(emb, prompts)
        bce, dice, n_pos = [], [], 0
        for i, target in enumerate(masks):
            target = target.to(dev, low.dtype)
            logits = self.postprocess(low[i], resized[i], (int(target.shape[-2]), int(target.shape[-1])))
            bce.append(F.binary_cross_entropy_with_logits(logits, target))
            if target.sum() > 0:
                dice.append(dice_loss(logits, target))
                n_pos += 1
        bce_t = torch.stack(bce).mean()
        dice_t = torch.stack(dice).mean() if dice else low.sum() * 0.0
        loss = CE_WEIGHT * out.loss + BCE_WEIGHT * bce_t + DICE_WEIGHT * dice_t
        return {
            "loss": loss,
            "ce": out.loss.detach(),
            "bce": bce_t.detach(),
            "dice": dice_t.detach(),
            "positives": torch.tensor(n_pos),
        }


def dice_loss(logits: torch.Tensor, target: torch.Tensor, scale: float = 1000.0, eps: float = 1e-6) -> torch.Tensor:
    """LISA's Dice loss of one mask: sigmoid, sums scaled by 1/``scale``, ``eps`` smoothing."""
    p = logits.sigmoid().flatten()
    t = target.flatten()
    numerator = 2 * (p / scale * t).sum()
    denominator = (p / scale).sum() + (t / scale).sum()
    return 1 - (numerator + eps) / (denominator + eps)


__all__ = [
    "RosaliaModel",
    "RosaliaEncoder",
    "RosaliaError",
    "EncodedImage",
    "EncodedText",
    "text_hidden_fcs",
    "clip_processor",
    "equalize",
    "dice_loss",
    "CE_WEIGHT",
    "BCE_WEIGHT",
    "DICE_WEIGHT",
    "IGNORE_INDEX",
    "SAM_PIXEL_MEAN",
    "SAM_PIXEL_STD",
    "CONFIG_NAME",
]
