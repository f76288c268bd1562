"""SFT of π_init / π_rev (training/sft.py) and the auxiliary mask head (training/aux_head.py).

Tiny random Gemma3 models (``build_random_vlm``) and 128 px phantoms, a few CPU steps each.
The helpers at the top also serve tests/test_training_grpo.py and tests/test_train_cli.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from monailabel_xflow.instructions import Instruction

EFFUSION = Instruction("effusion", kind="global")


# --- tiny data sets -----------------------------------------------------------------------------


def _save_png(path: Path, array: np.ndarray) -> str:
    from PIL import Image

    a = array.astype(np.uint8) * 255 if array.dtype == bool else array
    Image.fromarray(a).save(path)
    return str(path)


def phantom_cases(root: Path, n: int, size: int = 128, start: int = 0):
    """``n`` phantoms (effusion in even ones) saved as PNG: ``[(phantom, image_path, mask_path|None)]``."""
    from monailabel_xflow.data.phantom import generate_phantom

    root.mkdir(parents=True, exist_ok=True)
    out = []
    for s in range(start, start + n):
        ph = generate_phantom(s, size=size, findings=("effusion",) if s % 2 == 0 else ())
        img = _save_png(root / f"img{s}.png", np.round(ph.image * 255).astype(np.uint8))
        m = ph.finding_mask("effusion")
        out.append((ph, img, _save_png(root / f"mask{s}.png", m) if m.any() else None))
    return out


def init_sft_rows(root: Path, n: int = 2, size: int = 128, start: int = 0) -> list[dict]:
    """init-sft rows (the builder's schema) for phantoms, asking for effusion at chest level."""
    from monailabel_xflow.geometry import mask_to_box
    from monailabel_xflow.policy.targets import init_target

    rows = []
    for ph, img, mask in phantom_cases(root, n, size, start):
        lungs = {k: mask_to_box(v) for k, v in ph.lungs.items()}
        target = init_target(EFFUSION, ph.finding_mask("effusion"), lungs)
        rows.append(
            dict(
                image=img,
                prompt="Find and segment the effusion.",
                instruction=EFFUSION.text,
                target=target,
                lesion_mask=mask,
                case_id=f"c{ph.seed}",
                finding="effusion",
                level="chest",
                positive=mask is not None,
            )
        )
    return rows


def rev_sft_rows(root: Path, n: int = 1, errors: bool = False) -> list[dict]:
    """rev-sft rows: a hand-made 3-turn trajectory (click, click, stop) per positive phantom
    (with ``errors``, each turn's error map as the builder writes it)."""
    from monailabel_xflow.geometry import Click, mask_to_box
    from monailabel_xflow.policy.protocol import Stage2Action, format_stage2
    from monailabel_xflow.rendering import render_observation
    from monailabel_xflow.training.builders import error_map

    rows = []
    for ph, img, mask in phantom_cases(root, 2 * n):
        if mask is None:
            continue
        gt = ph.finding_mask("effusion")
        box = mask_to_box(gt)
        clicks = [Click(True, (box[0] + box[2]) / 2, (box[1] + box[3]) / 2), Click(False, 0.1, 0.1)]
        masks = [np.zeros_like(gt), gt & (np.arange(gt.shape[1]) < gt.shape[1] * 0.8)[None], gt]
        obs, errs, targets = [], [], []
        for t in range(3):
            o = render_observation(ph.image, masks[t], clicks[:t])
            obs.append(_save_png(root / f"obs{ph.seed}_{t}.png", o))
            errs.append(_save_png(root / f"err{ph.seed}_{t}.png", error_map(masks[t], gt)))
            targets.append(format_stage2(Stage2Action(clicks[t] if t < 2 else None, "Because.")))
        row = dict(image=img, instruction=EFFUSION.text, box=list(box), observations=obs, targets=targets)
        rows.append(dict(row, case_id=f"c{ph.seed}", **({"error_masks": errs} if errors else {})))
    return rows


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    """Tiny random Gemma3 base with a pretrained-like output scale (see :func:`_learnable_base`)."""
    from monailabel_xflow.policy.configs import RandomVLM

    return RandomVLM(_learnable_base(tmp_path_factory.mktemp("vlm")), None, None)


@pytest.fixture(scope="module")
def processor(vlm):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(vlm.base))


def sft_config(trainer: str = "init-sft", **kw):
    from monailabel_xflow.training.config import load_config

    base = dict(max_steps=12, effective_batch=2, learning_rate=1e-2, lora_r=8, lora_alpha=16)
    base.update(kw)
    return load_config(trainer, **base)


# --- encoding: what is trained is what inference asks ---------------------------------------------


def test_stage1_labels_cover_only_the_assistant_turn(tmp_path, vlm, processor):
    from monailabel_xflow.policy.vlm import VLMPolicy
    from monailabel_xflow.training.sft import PolicyExampleEncoder, policy_image

    row = init_sft_rows(tmp_path, 1)[0]
    ex = PolicyExampleEncoder(processor, "init-sft")(row)
    labelled = ex["labels"] != -100
    tok = processor.tokenizer
    # the labelled tokens are exactly the target followed by <end_of_turn>, at the end
    assert tok.decode(ex["input_ids"][labelled]) == row["target"] + "<end_of_turn>"
    first = int(labelled.nonzero()[0])
    assert labelled[first:].all() and not labelled[:first].any()
    # the prompt part is token for token what VLMPolicy feeds the model at inference
    from monailabel_xflow.transforms import load_cxr

    policy = VLMPolicy.from_pretrained(vlm.base)
    enc = policy.stage1_inputs(load_cxr(row["image"])[0], EFFUSION)
    assert ex["input_ids"][:first].tolist() == enc.input_ids[0].tolist()
    assert ex["token_type_ids"][:first].tolist() == enc.token_type_ids[0].tolist()
    assert np.allclose(ex["pixel_values"].numpy(), enc.pixel_values.numpy())
    assert policy_image(row["image"]).mode == "RGB"


def test_stage2_conversation_has_one_image_per_turn_and_labels_each_answer(tmp_path, processor):
    from monailabel_xflow.training.sft import PolicyExampleEncoder

    row = rev_sft_rows(tmp_path)[0]
    ex = PolicyExampleEncoder(processor, "rev-sft")(row)
    tok = processor.tokenizer
    assert ex["pixel_values"].shape[0] == len(row["observations"]) == 3
    per_image = int(ex["token_type_ids"].sum()) // 3
    assert per_image * 3 == int(ex["token_type_ids"].sum()) and per_image > 0
    labels, ids = ex["labels"], ex["input_ids"]
    # contiguous labelled spans, one per turn, each = target + <end_of_turn>
    spans, start = [], None
    for k, on in enumerate((labels != -100).tolist() + [False]):
        if on and start is None:
            start = k
        if not on and start is not None:
            spans.append((start, k))
            start = None
    assert [tok.decode(ids[a:b]) for a, b in spans] == [t + "<end_of_turn>" for t in row["targets"]]
    # no image token and no user text is ever labelled
    assert not (ex["token_type_ids"].bool() & (labels != -100)).any()
    text = tok.decode(ids)
    assert text.count("<start_of_turn>user") == 3 and text.count("<start_of_turn>model") == 3


def test_bad_rows_are_refused(tmp_path, vlm):
    from datasets import Dataset

    from monailabel_xflow.training.sft import SFTDataError, train_sft

    rows = Dataset.from_list([{"image": "x.png", "instruction": EFFUSION.text}])
    with pytest.raises(SFTDataError, match="target"):
        train_sft("init-sft", rows, vlm.base, tmp_path / "o", sft_config())


def test_aux_targets_follow_the_token_grid():
    from monailabel_xflow.training.aux_head import mask_token_targets, token_grid_side

    mask = np.zeros((64, 64), bool)
    mask[:32, 32:] = True  # top-right quarter
    assert token_grid_side(4) == 2
    assert np.allclose(mask_token_targets(mask, 2), [0, 1, 0, 0], atol=0.05)
    assert mask_token_targets(None, 4).shape == (16,)
    with pytest.raises(ValueError):
        token_grid_side(5)


def test_per_finding_aux_targets_and_loss():
    import torch

    from monailabel_xflow.training.aux_head import aux_mask_loss, finding_token_targets, mask_token_head

    mask = np.zeros((64, 64), bool)
    mask[32:, :32] = True  # bottom-left quarter
    targets = finding_token_targets(["", mask, None], 2)
    assert targets.shape == (4, 3)
    assert np.allclose(targets[:, 0], 0) and np.allclose(targets[:, 2], 0)
    assert np.allclose(targets[:, 1], [0, 0, 1, 0], atol=0.05)
    head = mask_token_head(8, channels=3)
    projected = torch.randn(2, 4, 8)
    loss = aux_mask_loss(projected, head, torch.from_numpy(np.stack([targets, targets])))
    assert loss.ndim == 0 and 0.2 < loss.item() < 2.0
    with pytest.raises(ValueError, match="3-channel head"):
        aux_mask_loss(projected, head, torch.zeros(2, 4))  # one channel for a three-channel head


def test_error_targets_split_what_a_mask_misses_from_what_it_spills():
    from monailabel_xflow.training.aux_head import error_token_targets
    from monailabel_xflow.training.builders import error_map

    target = np.zeros((64, 64), bool)
    target[:32, :32] = True  # the lesion: top-left quarter
    mask = np.zeros((64, 64), bool)
    mask[:32, 16:] = True  # covers its right half and spills into the top-right quarter
    rgb = error_map(mask, target)
    assert rgb.shape == (64, 64, 3) and rgb[..., 2].max() == 0
    assert (rgb[..., 0] > 0).sum() == 32 * 16 and (rgb[..., 1] > 0).sum() == 32 * 32
    cells = error_token_targets(rgb, 2)
    assert cells.shape == (4, 2)
    assert np.allclose(cells[:, 0], [0.5, 0, 0, 0], atol=0.05)  # missed: half of the top-left cell
    assert np.allclose(cells[:, 1], [0, 1, 0, 0], atol=0.05)  # spilled: the whole top-right cell


# --- training -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def init_sft(tmp_path_factory, vlm):
    """π_init SFT with the auxiliary mask loss, overfitting two phantoms."""
    from datasets import Dataset

    from monailabel_xflow.training.sft import train_sft

    root = tmp_path_factory.mktemp("init_sft")
    rows = Dataset.from_list(init_sft_rows(root / "data", 2))
    out = root / "out"
    summary = train_sft("init-sft", rows, vlm.base, out, sft_config(aux_mask_loss_weight=1.0), progress=False)
    return out, summary


def test_init_sft_loss_decreases_on_a_fixed_batch(init_sft):
    _, summary = init_sft
    losses = summary["losses"]
    assert len(losses) == 12 and np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3])
    assert summary["aux_mask_loss"] and np.isfinite(summary["aux_mask_loss"]).all()


def test_init_sft_saves_adapter_with_vision_tower_and_no_aux_head(init_sft, vlm):
    from safetensors import safe_open

    out, _ = init_sft
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert set(cfg["modules_to_save"]) == {"vision_tower", "multi_modal_projector"}
    assert "language_model" in cfg["target_modules"]
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert any("vision_tower" in k for k in keys) and any("lora_A" in k for k in keys)
    # LoRA only on the language model; nothing of the training-only head
    assert not any("lora" in k and "vision_tower" in k for k in keys)
    # every non-LoRA tensor is a weight of the plain base Gemma3: no trace of the auxiliary head
    from transformers import AutoModelForImageTextToText

    base_keys = set(AutoModelForImageTextToText.from_pretrained(str(vlm.base)).state_dict())
    extra = [k for k in keys if "lora_" not in k and k.removeprefix("base_model.model.") not in base_keys]
    assert extra == []
    assert sorted(p.name for p in out.iterdir() if p.suffix in (".safetensors", ".bin")) == [
        "adapter_model.safetensors"
    ]


def test_init_sft_adapter_loads_through_inference_code(init_sft, vlm, tmp_path):
    import torch
    from safetensors.torch import load_file

    from monailabel_xflow.data.phantom import generate_phantom
    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy

    out, _ = init_sft
    policy = VLMPolicy.from_pretrained(vlm.base, init_adapter=out, generation=GenerationSettings(max_new_tokens=24))
    text = policy.stage1(generate_phantom(3, size=128).image, EFFUSION)
    assert isinstance(text, str)
    # the trained tower is what runs under the "init" adapter
    saved = load_file(str(out / "adapter_model.safetensors"))
    name, tensor = next((k, v) for k, v in saved.items() if "vision_tower" in k and k.endswith("weight"))
    live = dict(policy.model.named_parameters())
    live_key = next(
        k
        for k in live
        if k.endswith(name.split("vision_tower.", 1)[1]) and ".modules_to_save.init." in k and "vision_tower" in k
    )
    assert torch.equal(live[live_key].detach(), tensor)
    base_key = live_key.replace(".modules_to_save.init.", ".original_module.")
    assert not torch.equal(live[base_key].detach(), tensor)  # it was trained


def test_rev_sft_warm_starts_from_init_and_loads_as_rev(init_sft, vlm, tmp_path):
    import torch
    from datasets import Dataset
    from safetensors.torch import load_file

    from monailabel_xflow.data.phantom import generate_phantom
    from monailabel_xflow.policy.base import RevisionState
    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy
    from monailabel_xflow.rendering import render_observation
    from monailabel_xflow.training.sft import load_policy_model, train_sft

    init_out, _ = init_sft
    # the warm-started model starts with π_init's weights (LoRA and tower)
    model, _ = load_policy_model(vlm.base, 4, 8, train_vision=True, init_from=init_out)
    saved = load_file(str(init_out / "adapter_model.safetensors"))
    live = {k.replace(".default", ""): v for k, v in model.state_dict().items()}
    live = {k.replace(".modules_to_save", ""): v for k, v in live.items()}
    for k, v in saved.items():
        assert torch.equal(live[k], v), k
    rows = Dataset.from_list(rev_sft_rows(tmp_path / "data"))
    out = tmp_path / "rev"
    summary = train_sft(
        "rev-sft", rows, vlm.base, out, sft_config("rev-sft", max_steps=2), init_from=init_out, progress=False
    )
    assert summary["init_from"] == str(init_out) and np.isfinite(summary["losses"]).all()
    policy = VLMPolicy.from_pretrained(
        vlm.base, init_adapter=init_out, rev_adapter=out, generation=GenerationSettings(max_new_tokens=8)
    )
    image = generate_phantom(0, size=128).image
    mask = np.zeros(image.shape, bool)
    session = policy.start(image, EFFUSION, (0.2, 0.2, 0.6, 0.6))
    text = session.step(
        RevisionState(image, EFFUSION, (0.2, 0.2, 0.6, 0.6), mask, [], render_observation(image, mask, []), 0)
    )
    assert isinstance(text, str)


def test_rev_sft_trains_a_tower_warm_started_from_a_frozen_tower_init(vlm, tmp_path):
    """π_init trained with the tower frozen (vision_lr_scale 0) saves no tower; π_rev warm-started
    from it with the tower trained starts from the base's tower and saves its own copy."""
    import torch
    from datasets import Dataset
    from safetensors.torch import load_file

    from monailabel_xflow.training.sft import load_policy_model, train_sft

    init_out = tmp_path / "init"
    rows = Dataset.from_list(init_sft_rows(tmp_path / "data", 2))
    train_sft("init-sft", rows, vlm.base, init_out, sft_config(max_steps=1, vision_lr_scale=0.0), progress=False)
    assert not [k for k in load_file(str(init_out / "adapter_model.safetensors")) if "vision_tower" in k]
    model, _ = load_policy_model(vlm.base, 4, 8, train_vision=True, init_from=init_out)
    params = dict(model.named_parameters())
    copies = [k for k in params if ".modules_to_save.default." in k and "vision_tower" in k]
    assert copies and all(
        torch.equal(params[k], params[k.replace(".modules_to_save.default.", ".original_module.")]) for k in copies
    )
    out = tmp_path / "rev"
    rev_rows = Dataset.from_list(rev_sft_rows(tmp_path / "rev-data"))
    summary = train_sft(
        "rev-sft", rev_rows, vlm.base, out, sft_config("rev-sft", max_steps=2), init_from=init_out, progress=False
    )
    assert summary["vision_trained"] and [
        k for k in load_file(str(out / "adapter_model.safetensors")) if "vision_tower" in k
    ]


def test_aux_loss_is_refused_without_its_targets_or_a_trainable_tower(vlm, tmp_path):
    from datasets import Dataset

    from monailabel_xflow.training.config import ConfigError
    from monailabel_xflow.training.sft import train_sft

    rows = Dataset.from_list(rev_sft_rows(tmp_path / "data"))
    with pytest.raises(ConfigError, match="error_masks"):
        train_sft("rev-sft", rows, vlm.base, tmp_path / "o", sft_config("rev-sft", aux_mask_loss_weight=1.0))
    with_errors = Dataset.from_list(rev_sft_rows(tmp_path / "data", errors=True))
    frozen = sft_config("rev-sft", aux_mask_loss_weight=1.0, vision_lr_scale=0.0)  # nothing for the loss to train
    with pytest.raises(ConfigError, match="vision_lr_scale"):
        train_sft("rev-sft", with_errors, vlm.base, tmp_path / "o", frozen)


def test_rev_sft_error_loss_targets_every_observation_and_falls(vlm, processor, tmp_path):
    """π_rev's auxiliary error loss: one (tokens, 2) target per observation of the row, and
    training lowers it (the tower learns to see what the mask misses and spills)."""
    from datasets import Dataset

    from monailabel_xflow.training.aux_head import token_grid_side
    from monailabel_xflow.training.sft import PolicyExampleEncoder, train_sft

    rows = rev_sft_rows(tmp_path / "data", 2, errors=True)
    side = token_grid_side(int(json.loads((vlm.base / "config.json").read_text())["mm_tokens_per_image"]))
    ex = PolicyExampleEncoder(processor, "rev-sft", side)(rows[0])
    assert tuple(ex["aux_target"].shape) == (3, side * side, 2) == (len(ex["pixel_values"]), side * side, 2)
    assert float(ex["aux_target"][0, :, 0].sum()) > 0 and float(ex["aux_target"][2].sum()) == 0  # empty, then exact
    cfg = sft_config("rev-sft", max_steps=16, aux_mask_loss_weight=1.0)
    summary = train_sft("rev-sft", Dataset.from_list(rows), vlm.base, tmp_path / "o", cfg, progress=False)
    aux = summary["aux_mask_loss"]
    assert len(aux) >= 8 and np.isfinite(aux).all()
    assert np.mean(aux[-3:]) < 0.7 * np.mean(aux[:3])


# --- learning check -------------------------------------------------------------------------------


def _placed_share(policy, cases) -> tuple[float, float, float, float]:
    """Shares of well-formed answers and of well-formed answers with the presence right and
    (when present) a lesion box IoU > 0.3; then the share of positives called present and the
    mean matched IoU of the lung boxes (over well-formed answers)."""
    from monailabel_xflow.geometry import lesion_boxes, mask_to_box
    from monailabel_xflow.policy.protocol import parse_stage1
    from monailabel_xflow.training.rewards import matched_box_iou

    formed = placed = called = positives = 0
    lung_ious = []
    for ph, _, _ in cases:
        parsed = parse_stage1(policy.stage1(ph.image, EFFUSION))
        gt = lesion_boxes(ph.finding_mask("effusion"))
        positives += bool(gt)
        if not parsed.ok:
            continue
        formed += 1
        value = parsed.value
        lung_ious.append(matched_box_iou([r.box for r in value.lungs], [mask_to_box(m) for m in ph.lungs.values()]))
        if not gt:
            placed += value.present is False and not value.lesions
        else:
            called += bool(value.present)
            placed += bool(value.present) and matched_box_iou([r.box for r in value.lesions], gt) > 0.3
    n = len(cases)
    return formed / n, placed / n, called / max(positives, 1), float(np.mean(lung_ious)) if lung_ious else 0.0


def _learnable_base(folder: Path, scale: float = 25.0) -> Path:
    """A tiny random Gemma3 whose tied embedding has a pretrained-like scale.

    A freshly initialised one (std 0.02, width 32) caps every logit near +-0.6, so no LoRA can
    fit any text (measured: loss 7.05 -> 5.77 in 150 steps, nothing well-formed); a pretrained
    model has a fitted output head that LoRA adapts. Scaling the tied embedding restores that.
    """
    import torch
    from transformers import AutoModelForImageTextToText

    from monailabel_xflow.policy.configs import build_random_vlm

    base = build_random_vlm(folder, adapters=False).base
    model = AutoModelForImageTextToText.from_pretrained(str(base))
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(scale)
    model.save_pretrained(str(base))
    return base


@pytest.mark.slow
def test_init_sft_learns_to_place_boxes(tmp_path):
    """Wiring check: SFT (aux loss on) must raise the share of well-formed, correctly placed
    answers on held-out phantoms over the untrained model. Prints the figures."""
    from datasets import Dataset

    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy
    from monailabel_xflow.training.sft import train_sft

    base = _learnable_base(tmp_path / "vlm")
    rows = Dataset.from_list(init_sft_rows(tmp_path / "train", 24))
    held_out = phantom_cases(tmp_path / "test", 10, start=1000)
    gen = GenerationSettings(max_new_tokens=160)
    before = _placed_share(VLMPolicy.from_pretrained(base, generation=gen), held_out)
    out = tmp_path / "out"
    cfg = sft_config(max_steps=300, effective_batch=4, learning_rate=1e-2, aux_mask_loss_weight=1.0)
    summary = train_sft("init-sft", rows, base, out, cfg, progress=False)
    after = _placed_share(VLMPolicy.from_pretrained(base, init_adapter=out, generation=gen), held_out)
    print(
        "(formed, placed, positives called present, lung-box IoU): untrained "
        f"{np.round(before, 2).tolist()}, after {summary['steps']} steps {np.round(after, 2).tolist()}; "
        f"loss {summary['losses'][0]:.3f} -> {summary['losses'][-1]:.3f}"
    )
    assert after[1] > before[1]
