"""Loading the released LISA / ROSALIA checkpoint layout (monailabel_xflow.rosalia.checkpoint).

The release is written here in the *official* layout, key by key from the public code's module
structure (segment-anything's ``image_encoder`` / ``prompt_encoder`` / ``mask_decoder``, LLaVA-v1's
``mm_projector``, LISA's ``text_hidden_fcs``), independently of the package's mapping table; the
CLIP tower is a separate folder in the openai ``CLIPModel`` layout (``vision_model.*``), as LISA
drops it from its release.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from monailabel_xflow.rosalia.checkpoint import load_lisa_checkpoint, map_key
from monailabel_xflow.rosalia.model import RosaliaError
from monailabel_xflow.rosalia.predictor import RosaliaPredictor

H, INTER, LAYERS = 32, 64, 2  # Llama
CLIP_H = 24
E, DEPTH, GRID = 32, 2, 4  # SAM encoder width, depth, 64 px / patch 16
D = 32  # SAM prompt / decoder width


def _lisa_tokenizer(folder):
    """A Llama-like tokenizer as LISA saves it: <unk> <s> </s>, then [SEG], <im_start>, <im_end>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        ["Segment the effusion in the left lung. There is no effusion. USER ASSISTANT"],
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<unk>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok.add_tokens(["[SEG]"])
    tok.add_special_tokens(["<im_start>", "<im_end>"])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return len(fast)


def _official_state(vocab: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.1  # noqa: E731
    s: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": r(vocab, H),
        "model.norm.weight": 1 + r(H),
        "lm_head.weight": r(vocab, H),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            s[p + f"self_attn.{n}.weight"] = r(H, H)
        s[p + "self_attn.rotary_emb.inv_freq"] = r(H // 4)  # old checkpoints carry it
        s[p + "mlp.gate_proj.weight"], s[p + "mlp.up_proj.weight"] = r(INTER, H), r(INTER, H)
        s[p + "mlp.down_proj.weight"] = r(H, INTER)
        s[p + "input_layernorm.weight"], s[p + "post_attention_layernorm.weight"] = 1 + r(H), 1 + r(H)
    s["model.mm_projector.weight"], s["model.mm_projector.bias"] = r(H, CLIP_H), r(H)
    # SAM (segment_anything ImageEncoderViT, window 2 in block 0, global attention in block 1)
    e = "model.visual_model.image_encoder."
    s[e + "patch_embed.proj.weight"], s[e + "patch_embed.proj.bias"] = r(E, 3, 16, 16), r(E)
    s[e + "pos_embed"] = r(1, GRID, GRID, E)
    for i, size in enumerate((2, GRID)):
        b = f"{e}blocks.{i}."
        s[b + "norm1.weight"], s[b + "norm1.bias"] = 1 + r(E), r(E)
        s[b + "attn.qkv.weight"], s[b + "attn.qkv.bias"] = r(3 * E, E), r(3 * E)
        s[b + "attn.proj.weight"], s[b + "attn.proj.bias"] = r(E, E), r(E)
        s[b + "attn.rel_pos_h"], s[b + "attn.rel_pos_w"] = r(2 * size - 1, E // 2), r(2 * size - 1, E // 2)
        s[b + "norm2.weight"], s[b + "norm2.bias"] = 1 + r(E), r(E)
        s[b + "mlp.lin1.weight"], s[b + "mlp.lin1.bias"] = r(2 * E, E), r(2 * E)
        s[b + "mlp.lin2.weight"], s[b + "mlp.lin2.bias"] = r(E, 2 * E), r(E)
    s[e + "neck.0.weight"], s[e + "neck.2.weight"] = r(D, E, 1, 1), r(D, D, 3, 3)
    for n in ("neck.1", "neck.3"):
        s[e + n + ".weight"], s[e + n + ".bias"] = 1 + r(D), r(D)
    p = "model.visual_model.prompt_encoder."
    s[p + "pe_layer.positional_encoding_gaussian_matrix"] = r(2, D // 2)
    for i in range(4):
        s[p + f"point_embeddings.{i}.weight"] = r(1, D)
    s[p + "not_a_point_embed.weight"], s[p + "no_mask_embed.weight"] = r(1, D), r(1, D)
    for n, shape in (("0", (4, 1, 2, 2)), ("3", (16, 4, 2, 2)), ("6", (D, 16, 1, 1))):
        s[p + f"mask_downscaling.{n}.weight"], s[p + f"mask_downscaling.{n}.bias"] = r(*shape), r(shape[0])
    for n, c in (("1", 4), ("4", 16)):
        s[p + f"mask_downscaling.{n}.weight"], s[p + f"mask_downscaling.{n}.bias"] = 1 + r(c), r(c)
    m = "model.visual_model.mask_decoder."

    def attention(prefix: str, inner: int) -> None:
        for n in ("q_proj", "k_proj", "v_proj"):
            s[f"{prefix}.{n}.weight"], s[f"{prefix}.{n}.bias"] = r(inner, D), r(inner)
        s[f"{prefix}.out_proj.weight"], s[f"{prefix}.out_proj.bias"] = r(D, inner), r(D)

    for i in range(2):
        t = f"{m}transformer.layers.{i}."
        attention(t + "self_attn", D)
        attention(t + "cross_attn_token_to_image", D // 2)
        attention(t + "cross_attn_image_to_token", D // 2)
        for k in range(1, 5):
            s[t + f"norm{k}.weight"], s[t + f"norm{k}.bias"] = 1 + r(D), r(D)
        s[t + "mlp.lin1.weight"], s[t + "mlp.lin1.bias"] = r(2 * D, D), r(2 * D)
        s[t + "mlp.lin2.weight"], s[t + "mlp.lin2.bias"] = r(D, 2 * D), r(D)
    attention(m + "transformer.final_attn_token_to_image", D // 2)
    s[m + "transformer.norm_final_attn.weight"], s[m + "transformer.norm_final_attn.bias"] = 1 + r(D), r(D)
    s[m + "iou_token.weight"], s[m + "mask_tokens.weight"] = r(1, D), r(4, D)
    s[m + "output_upscaling.0.weight"], s[m + "output_upscaling.0.bias"] = r(D, D // 4, 2, 2), r(D // 4)
    s[m + "output_upscaling.1.weight"], s[m + "output_upscaling.1.bias"] = 1 + r(D // 4), r(D // 4)
    s[m + "output_upscaling.3.weight"], s[m + "output_upscaling.3.bias"] = r(D // 4, D // 8, 2, 2), r(D // 8)
    for head, out in [(f"output_hypernetworks_mlps.{i}", D // 8) for i in range(4)] + [("iou_prediction_head", 4)]:
        for j, (o, i_) in enumerate(((D, D), (D, D), (out, D))):
            s[f"{m}{head}.layers.{j}.weight"], s[f"{m}{head}.layers.{j}.bias"] = r(o, i_), r(o)
    s["model.text_hidden_fcs.0.0.weight"], s["model.text_hidden_fcs.0.0.bias"] = r(H, H), r(H)
    s["model.text_hidden_fcs.0.2.weight"], s["model.text_hidden_fcs.0.2.bias"] = r(D, H), r(D)
    return s


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A tiny LISA release folder and its CLIP folder, in the official layouts."""
    from safetensors.torch import save_file
    from transformers import CLIPVisionConfig, CLIPVisionModel

    root = tmp_path_factory.mktemp("lisa")
    clip = root / "clip-vit"
    torch.manual_seed(1)
    tower = CLIPVisionModel(
        CLIPVisionConfig(
            hidden_size=CLIP_H,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        )
    )
    clip.mkdir()
    tower.config.save_pretrained(clip)
    clip_state = {"vision_model." + k: v.contiguous() for k, v in tower.state_dict().items()}
    clip_state["text_model.embeddings.token_embedding.weight"] = torch.zeros(4, 8)  # CLIPModel's text half
    save_file(clip_state, clip / "model.safetensors")
    lisa = root / "ROSALIA"
    lisa.mkdir()
    vocab = _lisa_tokenizer(lisa)
    state = _official_state(vocab, torch.Generator().manual_seed(0))
    torch.save(state, lisa / "pytorch_model.bin")
    (lisa / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LISAForCausalLM"],
                "model_type": "llava",
                "hidden_size": H,
                "intermediate_size": INTER,
                "num_hidden_layers": LAYERS,
                "num_attention_heads": 2,
                "rms_norm_eps": 1e-6,
                "vocab_size": vocab,
                "vision_tower": str(clip),
                "mm_vision_tower": str(clip),
                "mm_hidden_size": CLIP_H,
                "mm_vision_select_layer": -2,
                "mm_use_im_start_end": True,
                "out_dim": D,
                "train_mask_decoder": True,
            }
        )
    )
    return lisa, clip, state, clip_state


# Official name -> ours, written out by hand (not from the package's table).
PINNED = {
    "model.layers.1.self_attn.k_proj.weight": "llava.model.language_model.layers.1.self_attn.k_proj.weight",
    "model.norm.weight": "llava.model.language_model.norm.weight",
    "model.mm_projector.weight": "llava.model.multi_modal_projector.linear_1.weight",
    "model.visual_model.image_encoder.patch_embed.proj.weight": "sam.vision_encoder.patch_embed.projection.weight",
    "model.visual_model.image_encoder.blocks.1.norm2.bias": "sam.vision_encoder.layers.1.layer_norm2.bias",
    "model.visual_model.image_encoder.blocks.0.attn.rel_pos_w": "sam.vision_encoder.layers.0.attn.rel_pos_w",
    "model.visual_model.image_encoder.neck.2.weight": "sam.vision_encoder.neck.conv2.weight",
    "model.visual_model.image_encoder.neck.3.bias": "sam.vision_encoder.neck.layer_norm2.bias",
    "model.visual_model.prompt_encoder.point_embeddings.3.weight": "sam.prompt_encoder.point_embed.3.weight",
    "model.visual_model.prompt_encoder.mask_downscaling.6.weight": "sam.prompt_encoder.mask_embed.conv3.weight",
    "model.visual_model.prompt_encoder.no_mask_embed.weight": "sam.prompt_encoder.no_mask_embed.weight",
    "model.visual_model.prompt_encoder.pe_layer.positional_encoding_gaussian_matrix": "sam.shared_image_embedding.positional_embedding",
    "model.visual_model.mask_decoder.transformer.layers.0.norm4.weight": "sam.mask_decoder.transformer.layers.0.layer_norm4.weight",
    "model.visual_model.mask_decoder.transformer.layers.1.cross_attn_image_to_token.out_proj.weight": "sam.mask_decoder.transformer.layers.1.cross_attn_image_to_token.out_proj.weight",
    "model.visual_model.mask_decoder.transformer.norm_final_attn.bias": "sam.mask_decoder.transformer.layer_norm_final_attn.bias",
    "model.visual_model.mask_decoder.output_upscaling.3.weight": "sam.mask_decoder.upscale_conv2.weight",
    "model.visual_model.mask_decoder.output_upscaling.1.weight": "sam.mask_decoder.upscale_layer_norm.weight",
    "model.visual_model.mask_decoder.output_hypernetworks_mlps.2.layers.1.weight": "sam.mask_decoder.output_hypernetworks_mlps.2.layers.0.weight",
    "model.visual_model.mask_decoder.iou_prediction_head.layers.2.bias": "sam.mask_decoder.iou_prediction_head.proj_out.bias",
    "model.text_hidden_fcs.0.2.weight": "text_hidden_fcs.2.weight",
}


@pytest.fixture(scope="module")
def loaded(release):
    lisa, clip, _, _ = release
    return load_lisa_checkpoint(lisa)


def test_pinned_official_names_land_where_they_belong(release, loaded):
    _, _, state, clip_state = release
    ours = loaded.state_dict()
    for official, name in PINNED.items():
        assert torch.equal(ours[name], state[official]), official
    assert torch.equal(
        ours["sam.prompt_encoder.shared_embedding.positional_embedding"],
        state["model.visual_model.prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"],
    )
    assert torch.equal(
        ours["llava.model.vision_tower.encoder.layers.1.mlp.fc2.weight"],
        clip_state["vision_model.encoder.layers.1.mlp.fc2.weight"],
    )
    emb = ours["llava.model.language_model.embed_tokens.weight"]
    vocab = state["model.embed_tokens.weight"].shape[0]
    assert emb.shape[0] == vocab + 1  # <image> added for transformers' LLaVA
    assert torch.equal(emb[:vocab], state["model.embed_tokens.weight"])


def test_geometry_is_read_from_the_tensors(loaded):
    v = loaded.sam.config.vision_config
    assert (v.hidden_size, v.num_hidden_layers, v.num_attention_heads, v.image_size) == (E, DEPTH, 2, 64)
    assert v.global_attn_indexes == [1] and v.window_size == 2
    assert loaded.llava.config.image_seq_length == 16 and loaded.llava.config.vision_feature_layer == -2


def test_linear_projector_is_llava_v1s_single_linear(release, loaded):
    _, _, state, _ = release
    x = torch.randn(3, CLIP_H)
    with torch.no_grad():
        got = loaded.llava.model.multi_modal_projector(x)
    want = x @ state["model.mm_projector.weight"].T + state["model.mm_projector.bias"]
    assert torch.allclose(got, want, atol=1e-5)


def test_llava_15_mlp_projector_is_linear_gelu_linear(release, tmp_path):
    """LLaVA-1.5 bases (llava_arch.py: ``nn.Sequential(Linear, GELU, Linear)``) save ``mm_projector.{0,2}``."""
    lisa, _, state, _ = release
    g = torch.Generator().manual_seed(5)
    mlp = {k: v for k, v in state.items() if not k.startswith("model.mm_projector.")}
    mlp["model.mm_projector.0.weight"], mlp["model.mm_projector.0.bias"] = (
        torch.randn(H, CLIP_H, generator=g),
        torch.randn(H, generator=g),
    )
    mlp["model.mm_projector.2.weight"], mlp["model.mm_projector.2.bias"] = (
        torch.randn(H, H, generator=g),
        torch.randn(H, generator=g),
    )
    folder = tmp_path / "lisa-15"
    folder.mkdir()
    for f in lisa.iterdir():
        if f.name != "pytorch_model.bin":
            (folder / f.name).write_bytes(f.read_bytes())
    torch.save(mlp, folder / "pytorch_model.bin")
    model = load_lisa_checkpoint(folder)
    x = torch.randn(3, CLIP_H)
    with torch.no_grad():
        got = model.llava.model.multi_modal_projector(x)
    hidden = torch.nn.functional.gelu(x @ mlp["model.mm_projector.0.weight"].T + mlp["model.mm_projector.0.bias"])
    want = hidden @ mlp["model.mm_projector.2.weight"].T + mlp["model.mm_projector.2.bias"]
    assert torch.allclose(got, want, atol=1e-4)


def test_converted_release_answers_through_the_predictor(loaded, tmp_path):
    folder = loaded.save_pretrained(tmp_path / "converted")
    predictor = RosaliaPredictor.from_pretrained(folder, device="cpu")
    predictor.set_image(np.random.default_rng(0).random((50, 40)))
    mask, answer, trace = predictor.predict("Segment the effusion in the left lung.")
    assert mask.shape == (50, 40) and mask.dtype == bool
    assert "[SEG]" not in answer and trace["instruction"]["finding"] == "effusion"


def test_unknown_or_missing_parts_are_refused(release, tmp_path):
    lisa, clip, state, _ = release
    with pytest.raises(RosaliaError, match="unknown key"):
        map_key("model.visual_model.mask_decoder.something_new.weight")
    assert map_key("model.layers.0.self_attn.rotary_emb.inv_freq") == []
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in lisa.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    torch.save({k: v for k, v in state.items() if k != "model.norm.weight"}, broken / "pytorch_model.bin")
    with pytest.raises(RosaliaError, match="unset"):
        load_lisa_checkpoint(broken)
    torch.save({k: v for k, v in state.items() if "iou_prediction_head" not in k}, broken / "pytorch_model.bin")
    with pytest.raises(RosaliaError, match="lacks SAM tensor"):
        load_lisa_checkpoint(broken)
    cfg = json.loads((lisa / "config.json").read_text())
    cfg["vision_tower"] = cfg["mm_vision_tower"] = "openai/clip-vit-large-patch14"
    (broken / "config.json").write_text(json.dumps(cfg))
    torch.save(state, broken / "pytorch_model.bin")
    with pytest.raises(RosaliaError, match="CLIP"):
        load_lisa_checkpoint(broken)
    assert load_lisa_checkpoint(broken, clip=clip) is not None
