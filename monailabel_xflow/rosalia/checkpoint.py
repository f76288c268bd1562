"""Loading the released LISA / ROSALIA checkpoint layout into :class:`RosaliaModel`.

ROSALIA's weights are released the way LISA's are: LISA's ``merge_lora_weights_and_save_hf_model.py``
merges the LoRA weights into ``LISAForCausalLM`` and calls ``save_pretrained`` with every
``vision_tower`` tensor *removed*, so a release folder holds the Llama weights, LLaVA's linear
``mm_projector``, SAM ViT-H (``model.visual_model.*``, segment-anything names) and the projection
MLP (``model.text_hidden_fcs.0.*``), a ``config.json`` whose ``model_type`` is LLaVA-v1's own
``"llava"`` (not transformers' LLaVA: it is read as JSON here) and the Llama tokenizer with
``[SEG]``, ``<im_start>``, ``<im_end>`` added. The CLIP vision tower comes from the model its
config names (``vision_tower`` / ``mm_vision_tower``, ``openai/clip-vit-large-patch14``).

Key names were pinned from the public code (``dvlab-research/LISA``: ``model/LISA.py``,
``model/llava/model/llava_arch.py``, ``model/segment_anything/modeling/*.py``; the same files in
``KAIST-Edlab/ROSALIA``). The table :data:`KEY_MAP` maps them to ours (``llava.`` =
transformers' ``LlavaForConditionalGeneration``, ``sam.`` = ``SamModel``):

====================================================================  ==========================================================
LISA / ROSALIA release                                                 RosaliaModel
====================================================================  ==========================================================
``model.embed_tokens.weight``                                          ``llava.model.language_model.embed_tokens.weight``
``model.layers.N.<...>``                                               ``llava.model.language_model.layers.N.<...>``
``model.norm.weight``                                                  ``llava.model.language_model.norm.weight``
``lm_head.weight``                                                     ``llava.lm_head.weight``
``model.mm_projector.{weight,bias}`` (LLaVA-v1: one ``nn.Linear``)     ``llava.model.multi_modal_projector.linear_1.*``
                                                                       (``linear_2`` set to the identity, activation ``linear``)
``model.mm_projector.{0,2}.*`` (LLaVA-1.5 bases: Linear, GELU, Linear)  ``...multi_modal_projector.linear_{1,2}.*`` (activation ``gelu``)
``model.vision_tower.vision_tower.vision_model.<...>`` or the CLIP      ``llava.model.vision_tower.<...>``
model's ``vision_model.<...>``
``model.visual_model.image_encoder.patch_embed.proj.*``                ``sam.vision_encoder.patch_embed.projection.*``
``model.visual_model.image_encoder.pos_embed``                         ``sam.vision_encoder.pos_embed``
``...image_encoder.blocks.N.norm1`` / ``norm2``                        ``...vision_encoder.layers.N.layer_norm1`` / ``layer_norm2``
``...image_encoder.blocks.N.attn.{qkv,proj,rel_pos_h,rel_pos_w}``      ``...vision_encoder.layers.N.attn.{same}``
``...image_encoder.blocks.N.mlp.{lin1,lin2}``                          ``...vision_encoder.layers.N.mlp.{lin1,lin2}``
``...image_encoder.neck.{0,1,2,3}``                                    ``...vision_encoder.neck.{conv1,layer_norm1,conv2,layer_norm2}``
``...prompt_encoder.pe_layer.positional_encoding_gaussian_matrix``     ``sam.shared_image_embedding.positional_embedding`` and
                                                                       ``sam.prompt_encoder.shared_embedding.positional_embedding``
``...prompt_encoder.point_embeddings.N``                               ``sam.prompt_encoder.point_embed.N``
``...prompt_encoder.{not_a_point_embed,no_mask_embed}``                ``sam.prompt_encoder.{same}``
``...prompt_encoder.mask_downscaling.{0,1,3,4,6}``                     ``sam.prompt_encoder.mask_embed.{conv1,layer_norm1,conv2,layer_norm2,conv3}``
``...mask_decoder.{iou_token,mask_tokens}``                            ``sam.mask_decoder.{same}``
``...mask_decoder.transformer.layers.N.norm{1,2,3,4}``                 ``...transformer.layers.N.layer_norm{1,2,3,4}``
``...mask_decoder.transformer.layers.N.<attention / mlp>``             ``...transformer.layers.N.<same>`` (``q/k/v/out_proj``, ``mlp.lin1/2``)
``...mask_decoder.transformer.final_attn_token_to_image``              ``...transformer.final_attn_token_to_image``
``...mask_decoder.transformer.norm_final_attn``                        ``...transformer.layer_norm_final_attn``
``...mask_decoder.output_upscaling.{0,1,3}``                           ``sam.mask_decoder.{upscale_conv1,upscale_layer_norm,upscale_conv2}``
``...mask_decoder.{output_hypernetworks_mlps.N,iou_prediction_head}``  ``...{same}.{proj_in, layers.0, proj_out}``
``.layers.{0,1,2}``
``model.text_hidden_fcs.0.{0,2}.*``                                    ``text_hidden_fcs.{0,2}.*``
====================================================================  ==========================================================

Ignored: ``rotary_emb.inv_freq`` buffers (recomputed). transformers' LLaVA needs an ``<image>``
token, which LISA's tokenizer lacks: it is added (one embedding row more; its row is never read,
image features replace it). SAM ViT-H's geometry is read from the tensors' shapes (widths, depth,
heads from the relative-position tables, global-attention blocks, window); the mask decoder's head
count (8 in every SAM) is the one number shapes do not give (``sam_decoder_heads``).

Use :func:`convert_lisa_checkpoint` (or ``python -m monailabel_xflow.rosalia.checkpoint``) to write a
ROSALIA folder once; :func:`load_lisa_checkpoint` returns the model directly.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from monailabel_xflow.rosalia.model import RosaliaError, RosaliaModel
from monailabel_xflow.rosalia.templates import IMAGE_TOKEN

logger = logging.getLogger(__name__)

_SAM = "model.visual_model."

KEY_MAP: tuple[tuple[str, str], ...] = (
    # Llama
    (r"^model\.embed_tokens\.(.*)$", r"llava.model.language_model.embed_tokens.\1"),
    (r"^model\.layers\.(\d+)\.(.*)$", r"llava.model.language_model.layers.\1.\2"),
    (r"^model\.norm\.(.*)$", r"llava.model.language_model.norm.\1"),
    (r"^lm_head\.(.*)$", r"llava.lm_head.\1"),
    # LLaVA
    (r"^model\.mm_projector\.(weight|bias)$", r"llava.model.multi_modal_projector.linear_1.\1"),
    (r"^model\.mm_projector\.0\.(weight|bias)$", r"llava.model.multi_modal_projector.linear_1.\1"),
    (r"^model\.mm_projector\.2\.(weight|bias)$", r"llava.model.multi_modal_projector.linear_2.\1"),
    (r"^model\.vision_tower\.vision_tower\.vision_model\.(.*)$", r"llava.model.vision_tower.\1"),
    # SAM image encoder
    (r"^model\.visual_model\.image_encoder\.patch_embed\.proj\.(.*)$", r"sam.vision_encoder.patch_embed.projection.\1"),
    (r"^model\.visual_model\.image_encoder\.pos_embed$", r"sam.vision_encoder.pos_embed"),
    (
        r"^model\.visual_model\.image_encoder\.blocks\.(\d+)\.norm([12])\.(.*)$",
        r"sam.vision_encoder.layers.\1.layer_norm\2.\3",
    ),
    (r"^model\.visual_model\.image_encoder\.blocks\.(\d+)\.(attn|mlp)\.(.*)$", r"sam.vision_encoder.layers.\1.\2.\3"),
    (r"^model\.visual_model\.image_encoder\.neck\.0\.(.*)$", r"sam.vision_encoder.neck.conv1.\1"),
    (r"^model\.visual_model\.image_encoder\.neck\.1\.(.*)$", r"sam.vision_encoder.neck.layer_norm1.\1"),
    (r"^model\.visual_model\.image_encoder\.neck\.2\.(.*)$", r"sam.vision_encoder.neck.conv2.\1"),
    (r"^model\.visual_model\.image_encoder\.neck\.3\.(.*)$", r"sam.vision_encoder.neck.layer_norm2.\1"),
    # SAM prompt encoder
    (r"^model\.visual_model\.prompt_encoder\.point_embeddings\.(\d+)\.(.*)$", r"sam.prompt_encoder.point_embed.\1.\2"),
    (r"^model\.visual_model\.prompt_encoder\.(not_a_point_embed|no_mask_embed)\.(.*)$", r"sam.prompt_encoder.\1.\2"),
    (r"^model\.visual_model\.prompt_encoder\.mask_downscaling\.0\.(.*)$", r"sam.prompt_encoder.mask_embed.conv1.\1"),
    (
        r"^model\.visual_model\.prompt_encoder\.mask_downscaling\.1\.(.*)$",
        r"sam.prompt_encoder.mask_embed.layer_norm1.\1",
    ),
    (r"^model\.visual_model\.prompt_encoder\.mask_downscaling\.3\.(.*)$", r"sam.prompt_encoder.mask_embed.conv2.\1"),
    (
        r"^model\.visual_model\.prompt_encoder\.mask_downscaling\.4\.(.*)$",
        r"sam.prompt_encoder.mask_embed.layer_norm2.\1",
    ),
    (r"^model\.visual_model\.prompt_encoder\.mask_downscaling\.6\.(.*)$", r"sam.prompt_encoder.mask_embed.conv3.\1"),
    # SAM mask decoder
    (r"^model\.visual_model\.mask_decoder\.(iou_token|mask_tokens)\.(.*)$", r"sam.mask_decoder.\1.\2"),
    (
        r"^model\.visual_model\.mask_decoder\.transformer\.layers\.(\d+)\.norm(\d)\.(.*)$",
        r"sam.mask_decoder.transformer.layers.\1.layer_norm\2.\3",
    ),
    (
        r"^model\.visual_model\.mask_decoder\.transformer\.layers\.(\d+)\."
        r"(self_attn|cross_attn_token_to_image|cross_attn_image_to_token|mlp)\.(.*)$",
        r"sam.mask_decoder.transformer.layers.\1.\2.\3",
    ),
    (
        r"^model\.visual_model\.mask_decoder\.transformer\.final_attn_token_to_image\.(.*)$",
        r"sam.mask_decoder.transformer.final_attn_token_to_image.\1",
    ),
    (
        r"^model\.visual_model\.mask_decoder\.transformer\.norm_final_attn\.(.*)$",
        r"sam.mask_decoder.transformer.layer_norm_final_attn.\1",
    ),
    (r"^model\.visual_model\.mask_decoder\.output_upscaling\.0\.(.*)$", r"sam.mask_decoder.upscale_conv1.\1"),
    (r"^model\.visual_model\.mask_decoder\.output_upscaling\.1\.(.*)$", r"sam.mask_decoder.upscale_layer_norm.\1"),
    (r"^model\.visual_model\.mask_decoder\.output_upscaling\.3\.(.*)$", r"sam.mask_decoder.upscale_conv2.\1"),
    (
        r"^model\.visual_model\.mask_decoder\.(output_hypernetworks_mlps\.\d+|iou_prediction_head)\.layers\.0\.(.*)$",
        r"sam.mask_decoder.\1.proj_in.\2",
    ),
    (
        r"^model\.visual_model\.mask_decoder\.(output_hypernetworks_mlps\.\d+|iou_prediction_head)\.layers\.1\.(.*)$",
        r"sam.mask_decoder.\1.layers.0.\2",
    ),
    (
        r"^model\.visual_model\.mask_decoder\.(output_hypernetworks_mlps\.\d+|iou_prediction_head)\.layers\.2\.(.*)$",
        r"sam.mask_decoder.\1.proj_out.\2",
    ),
    # the projection MLP
    (r"^model\.text_hidden_fcs\.0\.(\d)\.(.*)$", r"text_hidden_fcs.\1.\2"),
)
"""``(official regex, our replacement)``, tried in order; see the module docstring's table."""

GAUSSIAN = "model.visual_model.prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"
"""SAM's one random-Fourier matrix, shared in transformers' SamModel by two modules."""
IGNORED = (re.compile(r"\.rotary_emb\.inv_freq$"),)
CLIP_PREFIX = "vision_model."

_COMPILED = tuple((re.compile(a), b) for a, b in KEY_MAP)


def map_key(key: str) -> list[str]:
    """Our name(s) of one official key ([] for an ignored key).

    Raises:
        RosaliaError: a key the table does not know.
    """
    if key == GAUSSIAN:
        return [
            "sam.shared_image_embedding.positional_embedding",
            "sam.prompt_encoder.shared_embedding.positional_embedding",
        ]
    if any(p.search(key) for p in IGNORED):
        return []
    for pattern, repl in _COMPILED:
        if pattern.match(key):
            return [pattern.sub(repl, key)]
    raise RosaliaError(f"unknown key {key!r} in a LISA/ROSALIA checkpoint")


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a ``save_pretrained`` folder (safetensors or ``pytorch_model*.bin`` shards)."""
    files = sorted(folder.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            state.update(load_file(f))
        return state
    files = sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise RosaliaError(f"no weights (*.safetensors, pytorch_model*.bin) in {folder}")
    for f in files:
        state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state


def _sam_geometry(state: Mapping[str, torch.Tensor], decoder_heads: int):
    """``SamConfig`` read from SAM tensors' shapes (see the module docstring)."""
    from transformers import SamConfig, SamMaskDecoderConfig, SamPromptEncoderConfig, SamVisionConfig

    enc = _SAM + "image_encoder."
    patch = state[enc + "patch_embed.proj.weight"]
    hidden, patch_size = patch.shape[0], patch.shape[-1]
    grid = state[enc + "pos_embed"].shape[1]
    depth = 1 + max(int(k.split(".")[4]) for k in state if k.startswith(enc + "blocks."))
    rel = [state[f"{enc}blocks.{i}.attn.rel_pos_h"] for i in range(depth)]
    head_dim = rel[0].shape[1]
    global_idx = [i for i, r in enumerate(rel) if r.shape[0] == 2 * grid - 1]
    windowed = [r.shape[0] for r in rel if r.shape[0] != 2 * grid - 1]
    window = (windowed[0] + 1) // 2 if windowed else 0
    dec = _SAM + "mask_decoder."
    dec_hidden = state[dec + "iou_token.weight"].shape[1]
    vision = SamVisionConfig(
        hidden_size=hidden,
        output_channels=state[enc + "neck.0.weight"].shape[0],
        num_hidden_layers=depth,
        num_attention_heads=hidden // head_dim,
        image_size=grid * patch_size,
        patch_size=patch_size,
        mlp_dim=state[enc + "blocks.0.mlp.lin1.weight"].shape[0],
        window_size=window,
        global_attn_indexes=global_idx,
        num_pos_feats=state[GAUSSIAN].shape[1],
    )
    decoder = SamMaskDecoderConfig(
        hidden_size=dec_hidden,
        num_attention_heads=decoder_heads,
        mlp_dim=state[dec + "transformer.layers.0.mlp.lin1.weight"].shape[0],
        num_hidden_layers=1 + max(int(k.split(".")[5]) for k in state if k.startswith(dec + "transformer.layers.")),
        iou_head_hidden_dim=state[dec + "iou_prediction_head.layers.0.weight"].shape[0],
        num_multimask_outputs=state[dec + "mask_tokens.weight"].shape[0] - 1,
    )
    prompt = SamPromptEncoderConfig(
        hidden_size=dec_hidden,
        image_size=vision.image_size,
        patch_size=patch_size,
        mask_input_channels=state[_SAM + "prompt_encoder.mask_downscaling.3.weight"].shape[0],
    )
    return SamConfig(
        vision_config=vision.to_dict(), prompt_encoder_config=prompt.to_dict(), mask_decoder_config=decoder.to_dict()
    )


def _clip_state(clip: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Vision config and ``vision_model.*`` tensors of a CLIPModel / CLIPVisionModel folder."""
    cfg = json.loads((clip / "config.json").read_text())
    vision_cfg = cfg.get("vision_config", cfg)
    vision_cfg = {k: v for k, v in vision_cfg.items() if k not in ("architectures", "transformers_version")}
    vision_cfg["model_type"] = "clip_vision_model"
    tensors = read_state_dict(clip)
    state = {k[len(CLIP_PREFIX) :]: v for k, v in tensors.items() if k.startswith(CLIP_PREFIX)}
    if not state:  # a CLIPVisionModel saved by transformers >= 5 has no prefix
        state = {
            k: v
            for k, v in tensors.items()
            if k.startswith(("embeddings.", "encoder.", "pre_layrnorm.", "post_layernorm."))
        }
    if not state:
        raise RosaliaError(f"{clip} holds no CLIP vision weights ({CLIP_PREFIX}*)")
    return vision_cfg, state


def load_lisa_checkpoint(
    lisa_dir: str | Path,
    clip: str | Path | None = None,
    *,
    sam_decoder_heads: int = 8,
    progress: Callable[[str], None] | None = None,
) -> RosaliaModel:
    """Build a :class:`RosaliaModel` from a LISA / ROSALIA release folder.

    Args:
        lisa_dir: the release folder (``config.json``, weights, tokenizer).
        clip: local CLIP folder (``openai/clip-vit-large-patch14`` layout); default: the folder
            the release's config names, when that is a local path.
        sam_decoder_heads: attention heads of SAM's mask decoder (8 in every released SAM).

    Raises:
        RosaliaError: missing parts, unknown keys, or model tensors the checkpoint does not fill.
    """
    from transformers import AutoTokenizer, LlamaConfig, LlavaConfig

    lisa_dir = Path(lisa_dir)
    say = progress or logger.info
    cfg_path = lisa_dir / "config.json"
    if not cfg_path.is_file():
        raise RosaliaError(f"{lisa_dir} has no config.json: not a LISA/ROSALIA release folder")
    cfg = json.loads(cfg_path.read_text())
    say(f"reading weights of {lisa_dir}")
    official = read_state_dict(lisa_dir)
    if not any(k.startswith(_SAM) for k in official) or "model.text_hidden_fcs.0.0.weight" not in official:
        raise RosaliaError(f"{lisa_dir} holds no SAM (model.visual_model.*) or text_hidden_fcs weights: not LISA")
    tokenizer = AutoTokenizer.from_pretrained(lisa_dir)
    if IMAGE_TOKEN not in tokenizer.get_vocab():
        tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.unk_token  # as LISA does

    clip_path = (
        Path(clip) if clip is not None else Path(str(cfg.get("vision_tower") or cfg.get("mm_vision_tower") or ""))
    )
    if not (clip_path / "config.json").is_file():
        raise RosaliaError(
            f"the CLIP vision tower is not in the release (LISA removes it); pass clip= a local "
            f"folder of {cfg.get('vision_tower') or cfg.get('mm_vision_tower') or 'the CLIP model'}"
        )
    vision_cfg, clip_state = _clip_state(clip_path)

    text_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    grid = vision_cfg["image_size"] // vision_cfg["patch_size"]
    two_layer = "model.mm_projector.0.weight" in official  # LLaVA-1.5's MLP projector (llava_arch.py)
    image_token_index = tokenizer.get_vocab()[IMAGE_TOKEN]  # added above when missing
    llava_config = LlavaConfig(
        text_config=text_config.to_dict(),
        vision_config=vision_cfg,
        image_token_index=image_token_index,
        image_seq_length=grid * grid,
        projector_hidden_act="gelu" if two_layer else "linear",
        vision_feature_layer=cfg.get("mm_vision_select_layer", -2),
        vision_feature_select_strategy="default",
        tie_word_embeddings=False,
    )
    try:
        sam_config = _sam_geometry(official, sam_decoder_heads)
    except KeyError as err:
        raise RosaliaError(f"{lisa_dir} lacks SAM tensor {err}") from err
    say("building the model")
    model = RosaliaModel.from_configs(llava_config, sam_config, tokenizer, source=str(lisa_dir))
    ours = model.state_dict()
    filled: set[str] = set()
    with torch.no_grad():
        for key, value in official.items():
            for name in map_key(key):
                if name not in ours:
                    raise RosaliaError(f"{key!r} maps to {name!r}, which the model does not have")
                target = ours[name]
                if name.endswith(("embed_tokens.weight", "lm_head.weight")) and value.shape[0] < target.shape[0]:
                    target[: value.shape[0]].copy_(value)  # + the <image> row(s) we added
                    target[value.shape[0] :].copy_(value.mean(0, keepdim=True))
                elif value.shape != target.shape:
                    raise RosaliaError(f"{key!r} has shape {tuple(value.shape)}, {name!r} needs {tuple(target.shape)}")
                else:
                    target.copy_(value)
                filled.add(name)
        for key, value in clip_state.items():  # a tower inside the release (unusual) takes precedence
            name = "llava.model.vision_tower." + key
            if name in ours and name not in filled:
                ours[name].copy_(value)
                filled.add(name)
        if not two_layer:  # LLaVA-v1's single linear: linear_2 is the identity
            lin2 = model.llava.model.multi_modal_projector.linear_2
            lin2.weight.copy_(torch.eye(lin2.weight.shape[0]))
            lin2.bias.zero_()
            filled |= {
                "llava.model.multi_modal_projector.linear_2.weight",
                "llava.model.multi_modal_projector.linear_2.bias",
            }
    missing = sorted(set(ours) - filled)
    if missing:
        raise RosaliaError(f"the checkpoint leaves {len(missing)} tensor(s) unset, e.g. {missing[:5]}")
    return model.eval()


def convert_lisa_checkpoint(
    lisa_dir: str | Path, out: str | Path, clip: str | Path | None = None, sam_decoder_heads: int = 8
) -> Path:
    """:func:`load_lisa_checkpoint` then :meth:`RosaliaModel.save_pretrained` to ``out``."""
    model = load_lisa_checkpoint(lisa_dir, clip, sam_decoder_heads=sam_decoder_heads)
    return model.save_pretrained(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Convert a released LISA/ROSALIA checkpoint to a ROSALIA folder.")
    parser.add_argument("lisa_dir")
    parser.add_argument("out")
    parser.add_argument("--clip", help="local CLIP folder (default: the one the release's config names)")
    args = parser.parse_args(argv)
    convert_lisa_checkpoint(args.lisa_dir, args.out, args.clip)
    print(args.out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["KEY_MAP", "map_key", "read_state_dict", "load_lisa_checkpoint", "convert_lisa_checkpoint"]
