"""The official ``sam3.pt`` layout mapped onto ``Sam3TrackerModel`` (DESIGN §5)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from monailabel_xflow.geometry import Click  # noqa: E402
from monailabel_xflow.segmenter import checkpoint as ckpt  # noqa: E402
from monailabel_xflow.segmenter.cache import EmbeddingCache  # noqa: E402
from monailabel_xflow.segmenter.configs import build_sam3_tracker  # noqa: E402
from monailabel_xflow.segmenter.loading import load_segmenter  # noqa: E402
from monailabel_xflow.segmenter.sam3 import Sam3Segmenter  # noqa: E402

# Parts of a real sam3.pt the promptable segmenter must skip (detector heads, video memory, rope).
EXTRA_OFFICIAL_KEYS = [
    "detector.backbone.vision_backbone.convs.0.conv_1x1.weight",
    "detector.backbone.language_backbone.encoder.token_embedding.weight",
    "detector.transformer.encoder.layers.0.linear1.weight",
    "detector.backbone.vision_backbone.trunk.blocks.0.attn.freqs_cis",
    "tracker.maskmem_backbone.mask_downsampler.encoder.0.weight",
    "tracker.transformer.encoder.layers.0.self_attn.q_proj.weight",
    "tracker.no_mem_pos_enc",
    "tracker.obj_ptr_proj.layers.0.weight",
]


@pytest.fixture(scope="module")
def model():
    return build_sam3_tracker("tiny", seed=1)


@pytest.fixture(scope="module")
def official(model):
    sd = ckpt.tracker_to_official(model.state_dict())
    for key in EXTRA_OFFICIAL_KEYS:
        sd[key] = torch.zeros(2, 2)
    return sd


def test_table_round_trips_every_model_tensor(model, official):
    back, report = ckpt.official_to_tracker(official)
    expected = model.state_dict()
    assert set(back) == set(expected)
    for key, tensor in expected.items():
        assert torch.equal(back[key], tensor), key
    assert sorted(report.ignored) == sorted(EXTRA_OFFICIAL_KEYS)
    assert report.unmapped == []


@pytest.mark.parametrize(
    "official_key, model_key",
    [  # facts from transformers' convert_sam3_video_to_hf.py and conversion_mapping.py
        (
            "detector.backbone.vision_backbone.trunk.blocks.3.attn.proj.weight",
            "vision_encoder.backbone.layers.3.attention.o_proj.weight",
        ),
        ("detector.backbone.vision_backbone.trunk.ln_pre.bias", "vision_encoder.backbone.layer_norm.bias"),
        (
            "detector.backbone.vision_backbone.trunk.patch_embed.proj.weight",
            "vision_encoder.backbone.embeddings.patch_embeddings.projection.weight",
        ),
        (
            "detector.backbone.vision_backbone.sam2_convs.0.dconv_2x2_1.weight",
            "vision_encoder.neck.fpn_layers.0.scale_layers.2.weight",
        ),
        (
            "detector.backbone.vision_backbone.sam2_convs.1.dconv_2x2.bias",
            "vision_encoder.neck.fpn_layers.1.scale_layers.0.bias",
        ),
        (
            "detector.backbone.vision_backbone.sam2_convs.2.conv_3x3.weight",
            "vision_encoder.neck.fpn_layers.2.proj2.weight",
        ),
        ("tracker.sam_prompt_encoder.mask_downscaling.6.bias", "prompt_encoder.mask_embed.conv3.bias"),
        ("tracker.sam_mask_decoder.output_upscaling.1.weight", "mask_decoder.upscale_layer_norm.weight"),
        (
            "tracker.sam_mask_decoder.iou_prediction_head.layers.1.bias",
            "mask_decoder.iou_prediction_head.layers.0.bias",
        ),
        (
            "tracker.sam_mask_decoder.pred_obj_score_head.layers.2.weight",
            "mask_decoder.pred_obj_score_head.proj_out.weight",
        ),
        (
            "tracker.sam_mask_decoder.transformer.layers.1.cross_attn_image_to_token.out_proj.bias",
            "mask_decoder.transformer.layers.1.cross_attn_image_to_token.o_proj.bias",
        ),
        (
            "tracker.sam_mask_decoder.transformer.layers.0.norm4.weight",
            "mask_decoder.transformer.layers.0.layer_norm4.weight",
        ),
        (
            "tracker.sam_mask_decoder.transformer.layers.0.mlp.lin1.weight",
            "mask_decoder.transformer.layers.0.mlp.proj_in.weight",
        ),
        (
            "tracker.sam_mask_decoder.transformer.layers.0.mlp.layers.1.weight",
            "mask_decoder.transformer.layers.0.mlp.proj_out.weight",
        ),
        (
            "tracker.sam_mask_decoder.transformer.norm_final_attn.bias",
            "mask_decoder.transformer.layer_norm_final_attn.bias",
        ),
        ("sam2_predictor.model.sam_mask_decoder.iou_token.weight", "mask_decoder.iou_token.weight"),
        ("tracker.no_mem_embed", "no_memory_embedding"),
    ],
)
def test_known_official_names(official_key, model_key):
    mapped, report = ckpt.official_to_tracker({official_key: torch.zeros(1)})
    assert list(mapped) == [model_key] and not report.unmapped and not report.ignored


def test_tensor_transforms():
    qkv = torch.arange(12.0).reshape(6, 2)
    pos = torch.arange(5.0 * 3).reshape(1, 5, 3)  # CLS + a 2 x 2 grid
    points = {f"tracker.sam_prompt_encoder.point_embeddings.{i}.weight": torch.full((1, 3), float(i)) for i in range(4)}
    gauss = torch.randn(2, 4)
    mapped, _ = ckpt.official_to_tracker(
        {
            "detector.backbone.vision_backbone.trunk.blocks.0.attn.qkv.weight": qkv,
            "detector.backbone.vision_backbone.trunk.pos_embed": pos,
            "tracker.sam_prompt_encoder.pe_layer.positional_encoding_gaussian_matrix": gauss,
            **points,
        }
    )
    attn = "vision_encoder.backbone.layers.0.attention."
    assert torch.equal(mapped[attn + "q_proj.weight"], qkv[:2])
    assert torch.equal(mapped[attn + "k_proj.weight"], qkv[2:4])
    assert torch.equal(mapped[attn + "v_proj.weight"], qkv[4:])
    assert torch.equal(mapped["vision_encoder.backbone.embeddings.position_embeddings"], pos[:, 1:])
    assert mapped["prompt_encoder.point_embed.weight"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert mapped["prompt_encoder.shared_embedding.positional_embedding"] is gauss
    assert mapped["shared_image_embedding.positional_embedding"] is gauss


def test_official_checkpoint_loads_and_predicts_exactly_like_the_model(tmp_path, model, official):
    folder = tmp_path / "finetuned"
    folder.mkdir()
    torch.save({"model": official, "epoch": 3}, folder / "sam3.pt")
    model.config.save_pretrained(folder)  # the tiny architecture, beside the checkpoint
    loaded = load_segmenter(folder / "sam3.pt", device="cpu", cache=EmbeddingCache())
    reference = Sam3Segmenter(model, device="cpu", cache=EmbeddingCache())
    for key, tensor in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], tensor), key
    image = np.random.default_rng(3).random((200, 240)).astype(np.float32)
    boxes = [(0.1, 0.2, 0.6, 0.7), (0.4, 0.1, 0.95, 0.5)]
    clicks = [[Click(True, 0.3, 0.4)], [Click(False, 0.6, 0.3)]]
    results = []
    for seg in (loaded, reference):
        seg.set_image(image)
        first = seg.predict(boxes)
        results.append(seg.predict(boxes, clicks=clicks, previous=first.low_res_logits))
    np.testing.assert_array_equal(results[0].logits, results[1].logits)
    np.testing.assert_array_equal(results[0].iou, results[1].iou)


def test_bare_state_dict_and_unknown_keys(tmp_path, model, official, caplog):
    extra = dict(official)
    extra["tracker.sam_mask_decoder.new_head.weight"] = torch.zeros(1)
    fresh = build_sam3_tracker("tiny", seed=2)
    report = ckpt.load_official_checkpoint(fresh, extra)
    assert report.ok and report.unmapped == ["tracker.sam_mask_decoder.new_head.weight"]
    assert "does not know" in caplog.text
    assert len(report.loaded) == len(model.state_dict())
    path = tmp_path / "bare.pt"
    torch.save(official, path)
    assert ckpt.read_official_state_dict(path).keys() == official.keys()


def test_missing_or_misshaped_tensors_are_refused(model, official):
    partial = {k: v for k, v in official.items() if "sam_mask_decoder.iou_token" not in k}
    with pytest.raises(ckpt.Sam3CheckpointError, match="mask_decoder.iou_token.weight"):
        ckpt.load_official_checkpoint(build_sam3_tracker("tiny"), partial)
    report = ckpt.load_official_checkpoint(build_sam3_tracker("tiny"), partial, strict=False)
    assert report.missing == ["mask_decoder.iou_token.weight"] and not report.ok
    wrong = dict(official)
    wrong["tracker.no_mem_embed"] = torch.zeros(1, 1, 7)
    with pytest.raises(ckpt.Sam3CheckpointError, match="no_memory_embedding"):
        ckpt.load_official_checkpoint(build_sam3_tracker("tiny"), wrong)


def test_unreadable_checkpoints(tmp_path):
    with pytest.raises(FileNotFoundError):
        ckpt.read_official_state_dict(tmp_path / "absent.pt")
    path = tmp_path / "list.pt"
    torch.save([1, 2, 3], path)
    with pytest.raises(ckpt.Sam3CheckpointError, match="state dict"):
        ckpt.read_official_state_dict(path)


def test_tracker_keys_filter(official):
    kept = ckpt.iter_tracker_keys(official)
    assert not set(kept) & set(EXTRA_OFFICIAL_KEYS)
    assert len(kept) == len(official) - len(EXTRA_OFFICIAL_KEYS)
