"""GRPO of π_init / π_rev (training/grpo.py): rollouts through the inference code, rewards
through training/rewards.py, F_seg in the π_rev loop. Tiny random models, two completions a step."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_training_sft import EFFUSION, phantom_cases


def rl_config(trainer: str, **kw):
    from monailabel_xflow.training.config import load_config

    base = dict(max_steps=2, effective_batch=2, num_generations=2, learning_rate=1e-2, max_clicks=3)
    base.update(kw)
    return load_config(trainer, **base)


def _adapter_weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def test_init_rl_rewards_come_from_rewards_py_and_update_the_adapter(tiny_vlm, tmp_path, monkeypatch):
    from datasets import Dataset

    from monailabel_xflow.geometry import lesion_boxes
    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy
    from monailabel_xflow.training import rewards
    from monailabel_xflow.training.grpo import train_grpo

    rows = []
    for ph, img, mask in phantom_cases(tmp_path / "data", 2):
        rows.append(
            dict(
                image=img,
                prompt=EFFUSION.text,
                instruction=EFFUSION.text,
                gt_boxes=[list(b) for b in lesion_boxes(ph.finding_mask("effusion"))],
                present=mask is not None,
                case_id=str(ph.seed),
            )
        )
    calls = []
    real = rewards.init_reward

    def spy(text, gt_boxes):
        out = dict(real(text, gt_boxes))
        calls.append((text, list(gt_boxes), out))
        # a random model earns 0 everywhere; vary one term so the group has an advantage
        out["format"] = out["format"] + (len(text) % 7) / 7.0
        return out

    monkeypatch.setattr(rewards, "init_reward", spy)
    out = tmp_path / "out"
    summary = train_grpo(
        "init-rl",
        Dataset.from_list(rows),
        tiny_vlm.base,
        out,
        tiny_vlm.init,
        rl_config("init-rl"),
        max_new_tokens=12,
        progress=False,
    )
    # 2 steps x 2 completions x 3 reward terms, each a call of the pure function
    assert len(calls) == 12
    assert {tuple(map(tuple, c[1])) for c in calls} <= {tuple(map(tuple, r["gt_boxes"])) for r in rows}
    assert all(isinstance(c[0], str) for c in calls)
    assert np.isfinite(summary["losses"]).all() and summary["steps"] == 2
    before, after = _adapter_weights(tiny_vlm.init), _adapter_weights(out)
    assert before.keys() == after.keys()
    assert any(not np.allclose(before[k].numpy(), after[k].numpy()) for k in before)
    policy = VLMPolicy.from_pretrained(tiny_vlm.base, init_adapter=out, generation=GenerationSettings(max_new_tokens=8))
    assert isinstance(policy.stage1(phantom_cases(tmp_path / "q", 1)[0][0].image, EFFUSION), str)
    assert json.loads((out / "xflow_training.json").read_text())["trainer"] == "init-rl"


def test_rev_rl_runs_multi_turn_episodes_with_the_segmenter(tiny_vlm, tiny_sam3, tmp_path, monkeypatch):
    from datasets import Dataset

    from monailabel_xflow.geometry import Click, mask_to_box
    from monailabel_xflow.policy import protocol
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.training import rewards
    from monailabel_xflow.training.grpo import train_grpo
    from monailabel_xflow.workflow import revision

    rows = []
    for ph, img, mask in phantom_cases(tmp_path / "data", 2):
        if mask is not None:
            rows.append(
                dict(
                    image=img,
                    instruction=EFFUSION.text,
                    start_box=list(mask_to_box(ph.finding_mask("effusion"))),
                    gt_mask=mask,
                    case_id=str(ph.seed),
                )
            )
    # A random model writes no valid click: read every answer as a positive click so that the
    # episodes take all max_clicks turns, with an observation image per turn in the completion.
    real_parse = protocol.parse_stage2

    def always_click(text):
        parsed = real_parse(text)
        parsed.value = protocol.Stage2Action(Click(True, 0.5, 0.5))
        parsed.problems = []
        return parsed

    monkeypatch.setattr(revision, "parse_stage2", always_click)  # the Stage 2 loop's reader
    calls = []
    real = rewards.revision_reward

    def spy(turns, first_mask, final_mask, gt):
        out = dict(real(turns, first_mask, final_mask, gt))
        calls.append((list(turns), first_mask.shape, final_mask.shape, gt.shape))
        out["gain"] = out["gain"] + (sum(map(len, turns)) % 5) / 5.0
        return out

    monkeypatch.setattr(rewards, "revision_reward", spy)
    segmenter = load_segmenter(tiny_sam3, device="cpu")
    out = tmp_path / "out"
    summary = train_grpo(
        "rev-rl",
        Dataset.from_list(rows),
        tiny_vlm.base,
        out,
        tiny_vlm.rev,
        rl_config("rev-rl", max_steps=1),
        segmenter=segmenter,
        max_new_tokens=6,
        progress=False,
    )
    assert calls and all(len(c[0]) == 3 for c in calls)  # max_clicks turns each
    assert all(c[1] == c[3] == (128, 128) for c in calls)
    assert np.isfinite(summary["losses"]).all()
    before, after = _adapter_weights(tiny_vlm.rev), _adapter_weights(out)
    assert any(not np.allclose(before[k].numpy(), after[k].numpy()) for k in before)


def test_rev_rl_needs_a_segmenter(tiny_vlm, tmp_path):
    from datasets import Dataset

    from monailabel_xflow.training.config import ConfigError
    from monailabel_xflow.training.grpo import train_grpo

    rows = Dataset.from_list(
        [dict(image="x.png", instruction=EFFUSION.text, start_box=[0, 0, 1, 1], gt_mask="m.png", case_id="a")]
    )
    with pytest.raises(ConfigError, match="segmenter"):
        train_grpo("rev-rl", rows, tiny_vlm.base, tmp_path / "o", None, rl_config("rev-rl"))


def test_rl_freezes_the_vision_tower_carried_by_an_sft_adapter(tiny_vlm, tmp_path):
    from monailabel_xflow.training.sft import load_policy_model, policy_lora_config, set_vision_trainable

    # an SFT-style adapter with the tower saved
    model, _ = load_policy_model(tiny_vlm.base, 4, 8, train_vision=True)
    model.save_pretrained(str(tmp_path / "sft"))
    rl_model, _ = load_policy_model(tiny_vlm.base, 4, 8, train_vision=False, init_from=tmp_path / "sft")
    assert set_vision_trainable(rl_model, False) > 0
    trainable = [n for n, p in rl_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and "language_model" in n for n in trainable)
    assert policy_lora_config(4, 8, False).modules_to_save is None
