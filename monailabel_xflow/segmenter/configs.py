"""Small ``Sam3TrackerConfig`` builders for tests, demos and CPU training.

The full SAM3 tracker (458 M parameters) is slow to encode an image on a CPU. Tests
and the demo training loop use the same architecture at a fraction of the width and depth:

* ``"tiny"``: a 2-layer, 32-wide ViT and a 32-wide prompt encoder / mask decoder, for unit
  tests.
* ``"small"``: a reduced-size model (4 layers, 128 wide) for demos that should learn something.
* ``"full"``: the default configuration of transformers (the real SAM3 tracker shape).

By default every size keeps the real input geometry: a 1008 x 1008 input, 14-pixel patches, a
72 x 72 embedding and 288 x 288 low-resolution masks, so preprocessing, prompt scaling and
``previous`` logits behave exactly as with the released weights. The reduced sizes also take a
smaller input (``image_size``, a multiple of 14): the demo F_seg uses 336 px (24 x 24 embedding,
96 x 96 masks), 9x fewer pixels than 1008 px, which makes end-to-end training that much cheaper
per step.

Heavy imports (torch, transformers) stay inside the functions: ``import monailabel_xflow``
must stay light.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from transformers import Sam3TrackerConfig, Sam3TrackerModel

SIZES = ("tiny", "small", "full")

# The tracker reads three FPN levels (288, 144, 72 for a 1008 input); the official model builds a
# fourth, 0.5x level for the detector and drops it for the tracker ("scalp"), so we never build it.
_TRACKER_SCALE_FACTORS = [4.0, 2.0, 1.0]

_SIZE_SPECS: dict[str, dict[str, Any]] = {
    # hidden: ViT width; layers: ViT depth; heads: ViT heads; global_attn: layers with global
    # attention (the others use 24 x 24 windows); fpn: width of the FPN, prompt encoder and decoder.
    "tiny": dict(hidden=32, layers=2, heads=2, global_attn=[1], fpn=32, mlp=64, dec_heads=2),
    "small": dict(hidden=128, layers=4, heads=4, global_attn=[1, 3], fpn=64, mlp=256, dec_heads=4),
}


def sam3_tracker_config(size: str = "tiny", image_size: int = 1008) -> Sam3TrackerConfig:
    """A ``Sam3TrackerConfig`` of the given size.

    Args:
        size: ``"tiny"``, ``"small"`` or ``"full"`` (see the module docstring).
        image_size: square input side in pixels, a multiple of 14 (``"full"``: 1008 only).

    Returns:
        The configuration; ``Sam3TrackerModel(config)`` builds a randomly initialised model.

    Raises:
        ValueError: an unknown size, or an input side that is not a multiple of 14 (or not 1008
            for ``"full"``).
    """
    from transformers import Sam3TrackerConfig

    if size not in SIZES:
        raise ValueError(f"unknown SAM3 size {size!r}; choose one of {', '.join(SIZES)}")
    if image_size % 14 or image_size < 14 * 8 or (size == "full" and image_size != 1008):
        raise ValueError(
            f"SAM3 {size} input must be a multiple of 14 px and at least 112 "
            f"(1008 for the full model), got {image_size}"
        )
    grid = image_size // 14
    if size == "full":
        config = Sam3TrackerConfig()
        vision: Any = config.vision_config  # a sub-config object once the config is built
        vision.scale_factors = list(_TRACKER_SCALE_FACTORS)
        return config
    s = _SIZE_SPECS[size]
    backbone = dict(
        # A small backbone given as a dict must name its type, or it becomes a generic config.
        model_type="sam3_vit_model",
        hidden_size=s["hidden"],
        intermediate_size=s["hidden"] * 4,
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        global_attn_indexes=s["global_attn"],
        window_size=min(24, grid),
        image_size=image_size,
        patch_size=14,
        pretrain_image_size=min(336, image_size),
    )
    vision = dict(
        model_type="sam3_vision_model",
        backbone_config=backbone,
        fpn_hidden_size=s["fpn"],
        backbone_feature_sizes=[[4 * grid, 4 * grid], [2 * grid, 2 * grid], [grid, grid]],
        scale_factors=list(_TRACKER_SCALE_FACTORS),
    )
    prompt = dict(hidden_size=s["fpn"], image_size=image_size, patch_size=14, mask_input_channels=16)
    decoder = dict(
        hidden_size=s["fpn"],
        mlp_dim=s["mlp"],
        num_hidden_layers=2,
        num_attention_heads=s["dec_heads"],
        iou_head_hidden_dim=s["fpn"],
    )
    return Sam3TrackerConfig(vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder)


def build_sam3_tracker(size: str = "tiny", seed: int = 0, image_size: int = 1008) -> Sam3TrackerModel:
    """A randomly initialised ``Sam3TrackerModel`` of the given size, in eval mode.

    Args:
        size, image_size: see :func:`sam3_tracker_config`.
        seed: torch seed for the initialisation (same seed, same weights).
    """
    import torch
    from transformers import Sam3TrackerModel

    config = sam3_tracker_config(size, image_size)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Sam3TrackerModel(config)
    finally:
        torch.random.set_rng_state(state)
    # In released weights the image-wide positional encoding and the prompt encoder's are one
    # Gaussian matrix (the official model has a single `pe_layer`); random init draws two.
    with torch.no_grad():
        model.shared_image_embedding.positional_embedding.copy_(
            model.prompt_encoder.shared_embedding.positional_embedding
        )
    return model.eval()


def build_random_sam3(path: str | Path, size: str = "tiny", seed: int = 0, image_size: int = 1008) -> Path:
    """Save a random ``Sam3TrackerModel`` in Hugging Face format (``save_pretrained``).

    Tests and the demo training use the folder as a stand-in for released weights; it loads with
    ``load_segmenter(path)`` or ``Sam3TrackerModel.from_pretrained(path)``.

    Args:
        path: folder to create (parents too); existing files in it are overwritten.
        size, image_size: see :func:`sam3_tracker_config`.
        seed: torch seed for the initialisation.

    Returns:
        The folder, as a Path.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    build_sam3_tracker(size, seed, image_size).save_pretrained(path)
    return path
