"""Load an official SAM3 checkpoint (``sam3.pt``) into ``transformers.Sam3TrackerModel``.

Fine-tuned F_seg checkpoints come in the official layout of facebookresearch/sam3:
one state dict whose keys start with ``detector.`` (the SAM3 image model: ViT trunk, necks, text
encoder, DETR heads) or ``tracker.`` (the SAM2-style tracker: prompt encoder, mask decoder,
video memory). The promptable segmenter needs only

* the ViT trunk ``detector.backbone.vision_backbone.trunk.*``,
* the tracker's own FPN neck ``detector.backbone.vision_backbone.sam2_convs.*``,
* ``tracker.sam_prompt_encoder.*``, ``tracker.sam_mask_decoder.*`` and ``tracker.no_mem_embed``.

The correspondence below was written from the facts in transformers' converters
(``models/sam3/convert_sam3_to_hf.py`` and ``models/sam3_video/convert_sam3_video_to_hf.py``,
where the internal prefixes ``sam3_model.`` / ``sam2_predictor.model.`` stand for the released
``detector.`` / ``tracker.``) and the ``sam3_tracker`` loading rules of transformers'
``conversion_mapping.py`` (trunk from the detector, neck from ``tracker_neck``). Besides renames,
four tensors change form:

* ``trunk.blocks.N.attn.qkv`` is split in three along dim 0 into ``q_proj``/``k_proj``/``v_proj``;
* ``trunk.pos_embed`` carries a leading CLS position (``1 + 24*24`` rows) that is dropped;
* ``sam_prompt_encoder.point_embeddings.{0..3}.weight`` are concatenated into ``point_embed``;
* the prompt encoder's Gaussian matrix fills both ``prompt_encoder.shared_embedding`` and the
  model-level ``shared_image_embedding``.

Rotary tables (``attn.freqs_cis``) are recomputed by transformers and skipped, as are the
detector-only and video-memory parts. Every key is accounted for in a :class:`CheckpointReport`:
loaded, deliberately ignored, unmapped (unknown to the table) or missing from the model.

The table is written once as pairs of templates and serves both directions:
:func:`tracker_to_official` (used by the tests, and to export fine-tuned weights for the official
code) is the exact inverse of :func:`official_to_tracker`.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from monailabel_xflow.errors import UnavailableError

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)


class Sam3CheckpointError(UnavailableError):
    """An official checkpoint that cannot fill the model (missing or mis-shaped tensors)."""


_TRUNK = "detector.backbone.vision_backbone.trunk."
_NECK = "detector.backbone.vision_backbone.sam2_convs."
_PE = "tracker.sam_prompt_encoder."
_MD = "tracker.sam_mask_decoder."

# (official template, Sam3TrackerModel template). Placeholders: {n} a number, {p} the rest of the
# key after the module (weight, bias, ...). Order matters only for readability: templates are
# anchored at both ends, so at most one matches a given key.
RENAMES: list[tuple[str, str]] = [
    # --- ViT trunk ---------------------------------------------------------------------------
    (_TRUNK + "patch_embed.proj.{p}", "vision_encoder.backbone.embeddings.patch_embeddings.projection.{p}"),
    (_TRUNK + "ln_pre.{p}", "vision_encoder.backbone.layer_norm.{p}"),
    (_TRUNK + "blocks.{n}.norm1.{p}", "vision_encoder.backbone.layers.{n}.layer_norm1.{p}"),
    (_TRUNK + "blocks.{n}.norm2.{p}", "vision_encoder.backbone.layers.{n}.layer_norm2.{p}"),
    (_TRUNK + "blocks.{n}.attn.proj.{p}", "vision_encoder.backbone.layers.{n}.attention.o_proj.{p}"),
    (_TRUNK + "blocks.{n}.mlp.fc1.{p}", "vision_encoder.backbone.layers.{n}.mlp.fc1.{p}"),
    (_TRUNK + "blocks.{n}.mlp.fc2.{p}", "vision_encoder.backbone.layers.{n}.mlp.fc2.{p}"),
    # --- the tracker's FPN neck (sam2_convs; the detector's own `convs` are not used) --------
    (_NECK + "{n}.dconv_2x2_0.{p}", "vision_encoder.neck.fpn_layers.{n}.scale_layers.0.{p}"),
    (_NECK + "{n}.dconv_2x2_1.{p}", "vision_encoder.neck.fpn_layers.{n}.scale_layers.2.{p}"),
    (_NECK + "{n}.dconv_2x2.{p}", "vision_encoder.neck.fpn_layers.{n}.scale_layers.0.{p}"),
    (_NECK + "{n}.conv_1x1.{p}", "vision_encoder.neck.fpn_layers.{n}.proj1.{p}"),
    (_NECK + "{n}.conv_3x3.{p}", "vision_encoder.neck.fpn_layers.{n}.proj2.{p}"),
    # --- prompt encoder ----------------------------------------------------------------------
    (_PE + "not_a_point_embed.{p}", "prompt_encoder.not_a_point_embed.{p}"),
    (_PE + "no_mask_embed.{p}", "prompt_encoder.no_mask_embed.{p}"),
    (_PE + "mask_downscaling.0.{p}", "prompt_encoder.mask_embed.conv1.{p}"),
    (_PE + "mask_downscaling.1.{p}", "prompt_encoder.mask_embed.layer_norm1.{p}"),
    (_PE + "mask_downscaling.3.{p}", "prompt_encoder.mask_embed.conv2.{p}"),
    (_PE + "mask_downscaling.4.{p}", "prompt_encoder.mask_embed.layer_norm2.{p}"),
    (_PE + "mask_downscaling.6.{p}", "prompt_encoder.mask_embed.conv3.{p}"),
    # --- mask decoder: tokens, high-resolution projections, upscaling ------------------------
    (_MD + "iou_token.{p}", "mask_decoder.iou_token.{p}"),
    (_MD + "mask_tokens.{p}", "mask_decoder.mask_tokens.{p}"),
    (_MD + "obj_score_token.{p}", "mask_decoder.obj_score_token.{p}"),
    (_MD + "conv_s0.{p}", "mask_decoder.conv_s0.{p}"),
    (_MD + "conv_s1.{p}", "mask_decoder.conv_s1.{p}"),
    (_MD + "output_upscaling.0.{p}", "mask_decoder.upscale_conv1.{p}"),
    (_MD + "output_upscaling.1.{p}", "mask_decoder.upscale_layer_norm.{p}"),
    (_MD + "output_upscaling.3.{p}", "mask_decoder.upscale_conv2.{p}"),
    # --- mask decoder: 3-layer MLP heads (layers.0/1/2 -> proj_in/layers.0/proj_out) ----------
    (_MD + "output_hypernetworks_mlps.{n}.layers.0.{p}", "mask_decoder.output_hypernetworks_mlps.{n}.proj_in.{p}"),
    (_MD + "output_hypernetworks_mlps.{n}.layers.1.{p}", "mask_decoder.output_hypernetworks_mlps.{n}.layers.0.{p}"),
    (_MD + "output_hypernetworks_mlps.{n}.layers.2.{p}", "mask_decoder.output_hypernetworks_mlps.{n}.proj_out.{p}"),
    (_MD + "iou_prediction_head.layers.0.{p}", "mask_decoder.iou_prediction_head.proj_in.{p}"),
    (_MD + "iou_prediction_head.layers.1.{p}", "mask_decoder.iou_prediction_head.layers.0.{p}"),
    (_MD + "iou_prediction_head.layers.2.{p}", "mask_decoder.iou_prediction_head.proj_out.{p}"),
    (_MD + "pred_obj_score_head.layers.0.{p}", "mask_decoder.pred_obj_score_head.proj_in.{p}"),
    (_MD + "pred_obj_score_head.layers.1.{p}", "mask_decoder.pred_obj_score_head.layers.0.{p}"),
    (_MD + "pred_obj_score_head.layers.2.{p}", "mask_decoder.pred_obj_score_head.proj_out.{p}"),
    # --- mask decoder: two-way transformer ---------------------------------------------------
    (_MD + "transformer.layers.{n}.{a}.q_proj.{p}", "mask_decoder.transformer.layers.{n}.{a}.q_proj.{p}"),
    (_MD + "transformer.layers.{n}.{a}.k_proj.{p}", "mask_decoder.transformer.layers.{n}.{a}.k_proj.{p}"),
    (_MD + "transformer.layers.{n}.{a}.v_proj.{p}", "mask_decoder.transformer.layers.{n}.{a}.v_proj.{p}"),
    (_MD + "transformer.layers.{n}.{a}.out_proj.{p}", "mask_decoder.transformer.layers.{n}.{a}.o_proj.{p}"),
    (_MD + "transformer.layers.{n}.norm{m}.{p}", "mask_decoder.transformer.layers.{n}.layer_norm{m}.{p}"),
    (_MD + "transformer.layers.{n}.mlp.lin1.{p}", "mask_decoder.transformer.layers.{n}.mlp.proj_in.{p}"),
    (_MD + "transformer.layers.{n}.mlp.lin2.{p}", "mask_decoder.transformer.layers.{n}.mlp.proj_out.{p}"),
    (
        _MD + "transformer.final_attn_token_to_image.{q}.{p}",
        "mask_decoder.transformer.final_attn_token_to_image.{q}.{p}",
    ),
    (
        _MD + "transformer.final_attn_token_to_image.out_proj.{p}",
        "mask_decoder.transformer.final_attn_token_to_image.o_proj.{p}",
    ),
    (_MD + "transformer.norm_final_attn.{p}", "mask_decoder.transformer.layer_norm_final_attn.{p}"),
    # --- the "no memory" token added to the lowest-resolution features of a single image -----
    ("tracker.no_mem_embed", "no_memory_embedding"),
]

# Some releases name the two-way transformer's MLP `layers.0/1` instead of `lin1/lin2`.
_ALIASES = [
    (re.compile(r"(\.transformer\.layers\.\d+\.mlp\.)layers\.0\."), r"\1lin1."),
    (re.compile(r"(\.transformer\.layers\.\d+\.mlp\.)layers\.1\."), r"\1lin2."),
    # transformers' converters read internal checkpoints with these prefixes.
    (re.compile(r"^sam3_model\."), "detector."),
    (re.compile(r"^sam2_predictor\.model\."), "tracker."),
]

# Keys with a tensor transform rather than a plain rename (see the module docstring).
QKV = re.compile(re.escape(_TRUNK) + r"blocks\.(\d+)\.attn\.qkv\.(weight|bias)$")
POS_EMBED = _TRUNK + "pos_embed"
POINT_EMBEDDINGS = re.compile(re.escape(_PE) + r"point_embeddings\.(\d+)\.weight$")
GAUSSIAN = _PE + "pe_layer.positional_encoding_gaussian_matrix"

# Keys deliberately left out: the detector (text encoder, DETR, geometry encoder, segmentation
# head, its own neck), the tracker's video memory, and rotary tables recomputed by transformers.
IGNORED = re.compile(
    r"^detector\.(?!backbone\.vision_backbone\.(trunk|sam2_convs)\.)"
    r"|^detector\.backbone\.vision_backbone\.trunk\.blocks\.\d+\.attn\.freqs_cis"
    r"|^tracker\.(?!sam_prompt_encoder\.|sam_mask_decoder\.|no_mem_embed$)"
)

_PLACEHOLDERS = {
    "n": r"\d+",
    "m": r"\d+",
    "p": r"[A-Za-z_][\w.]*",
    "a": r"self_attn|cross_attn_token_to_image|cross_attn_image_to_token",
    "q": r"q_proj|k_proj|v_proj",
}


def _compile(template: str) -> re.Pattern:
    pattern, pos = "", 0
    for m in re.finditer(r"\{(\w)\}", template):
        pattern += re.escape(template[pos : m.start()]) + f"(?P<{m.group(1)}>{_PLACEHOLDERS[m.group(1)]})"
        pos = m.end()
    return re.compile("^" + pattern + re.escape(template[pos:]) + "$")


_FORWARD = [(_compile(src), dst) for src, dst in RENAMES]
_BACKWARD = [(_compile(dst), src) for src, dst in RENAMES]


def _rename(key: str, table: list[tuple[re.Pattern, str]]) -> str | None:
    for pattern, template in table:
        m = pattern.match(key)
        if m:
            return template.format(**m.groupdict())
    return None


def _drop_cls(pos_embed: torch.Tensor) -> torch.Tensor:
    """``(1, 1 + S*S, C)`` trunk positions -> ``(1, S*S, C)``; a table without CLS passes as is."""
    rows = pos_embed.shape[1]
    side = math.isqrt(rows - 1)
    return pos_embed[:, 1:] if side * side == rows - 1 else pos_embed


def normalise_official_key(key: str) -> str:
    """Apply the naming aliases (internal prefixes, ``mlp.layers.N``) to an official key."""
    for pattern, repl in _ALIASES:
        key = pattern.sub(repl, key)
    return key


@dataclass
class CheckpointReport:
    """What happened to every key of an official state dict.

    Attributes:
        loaded: model keys filled from the checkpoint.
        ignored: official keys deliberately skipped (detector, video memory, rotary tables).
        unmapped: official keys the mapping does not know (a different release or a typo).
        missing: model keys nothing filled (the model keeps its initial values for them).
        mismatched: ``"key: checkpoint shape vs model shape"`` for tensors of the wrong shape.
    """

    loaded: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every model tensor came from the checkpoint with the right shape."""
        return not self.missing and not self.mismatched

    def summary(self) -> str:
        text = (
            f"{len(self.loaded)} loaded, {len(self.ignored)} ignored, {len(self.unmapped)} unmapped, "
            f"{len(self.missing)} missing, {len(self.mismatched)} mismatched"
        )
        for name in ("unmapped", "missing", "mismatched"):
            keys = getattr(self, name)
            if keys:
                text += f"\n  {name}: " + ", ".join(keys[:10]) + (" ..." if len(keys) > 10 else "")
        return text


def official_to_tracker(official: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], CheckpointReport]:
    """Map an official SAM3 state dict onto ``Sam3TrackerModel`` keys.

    Args:
        official: the released state dict (``detector.*`` / ``tracker.*`` keys).

    Returns:
        ``(state_dict, report)``; the report's ``missing``/``mismatched`` are filled later by
        :func:`load_official_checkpoint`, which knows the model.
    """
    import torch

    out: dict[str, torch.Tensor] = {}
    report = CheckpointReport()
    point_embeddings: dict[int, torch.Tensor] = {}
    for raw_key, tensor in official.items():
        key = normalise_official_key(raw_key)
        if IGNORED.search(key):
            report.ignored.append(raw_key)
            continue
        if m := QKV.match(key):
            base = f"vision_encoder.backbone.layers.{m.group(1)}.attention."
            for name, part in zip(("q_proj", "k_proj", "v_proj"), torch.chunk(tensor, 3, dim=0), strict=False):
                out[f"{base}{name}.{m.group(2)}"] = part
        elif key == POS_EMBED:
            out["vision_encoder.backbone.embeddings.position_embeddings"] = _drop_cls(tensor)
        elif m := POINT_EMBEDDINGS.match(key):
            point_embeddings[int(m.group(1))] = tensor
        elif key == GAUSSIAN:
            out["prompt_encoder.shared_embedding.positional_embedding"] = tensor
            out["shared_image_embedding.positional_embedding"] = tensor
        elif (new := _rename(key, _FORWARD)) is not None:
            out[new] = tensor
        else:
            report.unmapped.append(raw_key)
    if point_embeddings:
        order = sorted(point_embeddings)
        if order != list(range(len(order))):
            report.unmapped.extend(f"{_PE}point_embeddings.{i}.weight" for i in order)
        else:
            out["prompt_encoder.point_embed.weight"] = torch.cat([point_embeddings[i] for i in order], dim=0)
    return out, report


def tracker_to_official(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`official_to_tracker`: ``Sam3TrackerModel`` keys -> official keys.

    The CLS position the official trunk carries (dropped on the way in) is written as zeros.
    Exports fine-tuned weights for the official code, and lets the tests round-trip the table.

    Raises:
        KeyError: a model key the table cannot express.
    """
    import torch

    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    fpn_re = re.compile(r"^(vision_encoder\.neck\.fpn_layers\.\d+\.)scale_layers\.0\.")
    qkv_re = re.compile(r"^vision_encoder\.backbone\.layers\.(\d+)\.attention\.(q_proj|k_proj|v_proj)\.(weight|bias)$")
    for key, tensor in state_dict.items():
        if m := qkv_re.match(key):
            qkv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = tensor
        elif key == "vision_encoder.backbone.embeddings.position_embeddings":
            cls = torch.zeros_like(tensor[:, :1])
            out[POS_EMBED] = torch.cat([cls, tensor], dim=1)
        elif key == "prompt_encoder.point_embed.weight":
            for i, row in enumerate(tensor.split(1, dim=0)):
                out[f"{_PE}point_embeddings.{i}.weight"] = row.clone()
        elif key == "prompt_encoder.shared_embedding.positional_embedding":
            out[GAUSSIAN] = tensor
        elif key == "shared_image_embedding.positional_embedding":
            continue  # the same Gaussian matrix, written once above
        elif (old := _rename(key, _BACKWARD)) is not None:
            if (m := fpn_re.match(key)) and not any(k.startswith(m.group(1) + "scale_layers.2.") for k in state_dict):
                # a 2x level has one transposed conv, named `dconv_2x2` (a 4x level has `_0`, `_1`)
                old = old.replace(".dconv_2x2_0.", ".dconv_2x2.")
            out[old] = tensor
        else:
            raise KeyError(f"no official name for model key {key!r}")
    for (layer, kind), parts in qkv.items():
        out[f"{_TRUNK}blocks.{layer}.attn.qkv.{kind}"] = torch.cat(
            [parts["q_proj"], parts["k_proj"], parts["v_proj"]], dim=0
        )
    return out


def read_official_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read ``sam3.pt`` (or a fine-tuned checkpoint in its layout) onto the CPU.

    Accepts a bare state dict or one wrapped under ``"model"`` / ``"state_dict"``; loads with
    ``weights_only=True`` (no pickled code runs).

    Raises:
        FileNotFoundError: no such file.
        Sam3CheckpointError: the file holds no state dict.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SAM3 checkpoint not found: {path}")
    obj = torch.load(path, map_location="cpu", weights_only=True)
    for wrapper in ("model", "state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
            break
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise Sam3CheckpointError(f"{path} does not hold a state dict (got {type(obj).__name__})")
    return obj


def load_official_checkpoint(
    model: torch.nn.Module, source: str | Path | Mapping[str, torch.Tensor], strict: bool = True
) -> CheckpointReport:
    """Fill a ``Sam3TrackerModel`` from an official checkpoint (a path or a state dict).

    Args:
        model: the model to fill in place (its configuration must match the checkpoint's).
        source: ``sam3.pt``-style file or an already loaded state dict.
        strict: raise when a model tensor is missing or mis-shaped (otherwise only log).

    Returns:
        The report; unmapped keys are logged as a warning either way.

    Raises:
        Sam3CheckpointError: with ``strict``, when the checkpoint does not fill the whole model.
    """
    official = read_official_state_dict(source) if isinstance(source, (str, Path)) else source
    mapped, report = official_to_tracker(official)
    expected = model.state_dict()
    usable = {}
    for key, tensor in mapped.items():
        if key not in expected:
            report.unmapped.append(key)
        elif tuple(tensor.shape) != tuple(expected[key].shape):
            report.mismatched.append(f"{key}: {tuple(tensor.shape)} vs {tuple(expected[key].shape)}")
        else:
            usable[key] = tensor
    report.missing = sorted(set(expected) - set(usable) - {m.split(":")[0] for m in report.mismatched})
    report.mismatched.sort()
    report.loaded = sorted(usable)
    if report.unmapped:
        logger.warning(
            "SAM3 checkpoint: %d keys the mapping does not know: %s", len(report.unmapped), report.unmapped[:10]
        )
    if strict and not report.ok:
        raise Sam3CheckpointError("the SAM3 checkpoint does not fill the tracker model: " + report.summary())
    model.load_state_dict(usable, strict=False)
    logger.info("SAM3 checkpoint: %s", report.summary())
    return report


def iter_tracker_keys(official_keys: Iterable[str]) -> list[str]:
    """Official keys the tracker uses (neither ignored nor unknown); handy to slim a checkpoint."""
    keep = []
    for raw in official_keys:
        key = normalise_official_key(raw)
        if IGNORED.search(key):
            continue
        if QKV.match(key) or key in (POS_EMBED, GAUSSIAN) or POINT_EMBEDDINGS.match(key) or _rename(key, _FORWARD):
            keep.append(raw)
    return keep
