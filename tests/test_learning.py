"""Learning checks in the default suite: a trainer must improve a measure a broken trainer would not.

* F_seg: a random tiny SAM3 fine-tuned on a few ellipses raises box-prompted IoU on held-out ones.
* π_init SFT: init-sft on a few phantoms raises the likelihood of held-out phantoms' answers.
* π_init GRPO: init-rl with the real R_init and parser raises the mean reward on a fixed batch.

Tiny models on CPU, cut to a few minutes together; the figures are printed (``-s``). The
slower π_init check on greedy answers stays ``slow``
(tests/test_training_sft.py::test_init_sft_learns_to_place_boxes).
"""

from __future__ import annotations

import numpy as np


def _ellipse_sample(seed: int):
    """A 128x160 image holding one bright ellipse (size and place drawn from ``seed``) and its mask."""
    from monailabel_xflow.training.segmenter import SegSample

    r = np.random.default_rng(seed)
    cy, cx, ry, rx = r.uniform(35, 90), r.uniform(40, 120), r.uniform(12, 25), r.uniform(15, 35)
    yy, xx = np.mgrid[:128, :160]
    mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1
    image = np.full(mask.shape, 0.3, np.float32)
    image[mask] = 0.8
    return SegSample(image, mask)


def test_segmenter_finetuning_raises_held_out_box_prompted_iou(tmp_path):
    """30 steps on 12 ellipses take a random tiny SAM3 from chance to near-perfect box-prompted
    IoU on 6 other ellipses (measured: 0.10 -> 0.97; 20 steps are not yet enough)."""
    from monailabel_xflow.segmenter.configs import build_random_sam3
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.training.config import SegmenterTrainConfig
    from monailabel_xflow.training.segmenter import box_prompted_iou, finetune_segmenter

    train, held_out = [_ellipse_sample(i) for i in range(12)], [_ellipse_sample(100 + i) for i in range(6)]
    base = build_random_sam3(tmp_path / "base", "tiny")
    before = box_prompted_iou(load_segmenter(str(base)), held_out)
    cfg = SegmenterTrainConfig(effective_batch=1, max_steps=30, learning_rate=2e-3, seed=0)
    result = finetune_segmenter(base, train, tmp_path / "ft", cfg, progress=False)
    after = box_prompted_iou(load_segmenter(str(tmp_path / "ft")), held_out)
    losses = result["losses"]
    print(
        f"\nF_seg held-out box-prompted IoU {before:.3f} -> {after:.3f} after {result['steps']} steps; "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    )
    assert np.isfinite(losses).all() and np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert after > before + 0.3 and after > 0.6, (before, after)


def _held_out_answer_nll(base, adapter, rows) -> float:
    """Mean per-token negative log-likelihood of the rows' target answers, teacher-forced on the
    exact ids SFT trains on (same encoder, labels only on the answer), for ``base`` with the
    adapter folder ``adapter`` (None: a fresh LoRA, i.e. the untrained model)."""
    import torch

    from monailabel_xflow.training.sft import PolicyExampleEncoder, load_policy_model

    model, processor = load_policy_model(base, 8, 16, False, init_from=adapter)
    model.eval()
    encode = PolicyExampleEncoder(processor, "init-sft")
    losses = []
    with torch.no_grad():
        for row in rows:
            ex = encode(row)
            out = model(
                input_ids=ex["input_ids"][None],
                token_type_ids=ex["token_type_ids"][None],
                attention_mask=torch.ones_like(ex["input_ids"])[None],
                pixel_values=ex["pixel_values"],
                labels=ex["labels"][None],
            )
            losses.append(float(out.loss))
    return float(np.mean(losses))


def test_init_sft_raises_held_out_answer_likelihood(tmp_path):
    """60 init-sft steps (aux mask loss on) on 6 effusion-free phantoms take the held-out answers'
    NLL from untrained to a fraction of it on 3 other phantoms (measured: train loss 11.5 -> 0.91
    as means of the first/last 5 steps, held-out NLL 14.05 -> 2.18 per token). Greedy answers of a
    model this small are not yet well-formed at this budget (lung-box IoU stays 0; see the slow
    test), so the figure is the held-out likelihood of the very answers the protocol asks for."""
    from datasets import Dataset
    from test_training_sft import _learnable_base, init_sft_rows, sft_config

    from monailabel_xflow.training.sft import train_sft

    base = _learnable_base(tmp_path / "vlm")
    train = [r for r in init_sft_rows(tmp_path / "train", 12) if not r["positive"]]
    held_out = [r for r in init_sft_rows(tmp_path / "test", 6, start=1000) if not r["positive"]]
    assert len(train) == 6 and len(held_out) == 3
    before = _held_out_answer_nll(base, None, held_out)
    cfg = sft_config(max_steps=60, effective_batch=2, learning_rate=2e-2, aux_mask_loss_weight=1.0, seed=0)
    summary = train_sft("init-sft", Dataset.from_list(train), base, tmp_path / "out", cfg, progress=False)
    after = _held_out_answer_nll(base, tmp_path / "out", held_out)
    losses = np.asarray(summary["losses"])
    print(
        f"\nπ_init SFT held-out answer NLL/token {before:.2f} -> {after:.2f} after {summary['steps']} steps; "
        f"loss {np.mean(losses[:5]):.3f} -> {np.mean(losses[-5:]):.3f} (means of first/last 5)"
    )
    assert np.isfinite(losses).all() and np.mean(losses[-5:]) < 0.3 * np.mean(losses[:5])
    assert after < 0.5 * before, (before, after)


def _mean_init_reward(base, adapter, rows, seeds, temperature: float, max_new_tokens: int) -> float:
    """Mean R_init (training/rewards.py, its own parser) of Stage 1 answers sampled by the
    inference policy with fixed seeds: one answer per row and seed, the same draws every call."""
    from monailabel_xflow.instructions import parse_instruction
    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy
    from monailabel_xflow.training import rewards
    from monailabel_xflow.transforms import load_cxr

    policy = VLMPolicy.from_pretrained(base, init_adapter=adapter)
    totals = []
    for row in rows:
        image = load_cxr(row["image"])[0]
        for seed in seeds:
            policy.generation = GenerationSettings(
                do_sample=True, temperature=temperature, seed=seed, max_new_tokens=max_new_tokens
            )
            answer = policy.stage1(image, parse_instruction(row["instruction"]))
            totals.append(rewards.init_reward(answer, [tuple(b) for b in row["gt_boxes"]])["total"])
    return float(np.mean(totals))


def test_init_grpo_raises_mean_reward_on_a_fixed_batch(tmp_path):
    """From a short init-sft adapter (150 steps on 4 effusion-free phantoms), 6 init-rl steps with
    the real R_init and parser (4 rows x 4 completions, temperature 0.3, no KL, lr 3e-4) raise the
    mean reward of 8 fixed-seed samples per row on those rows (measured: 0.875 -> 1.531; reward per
    step 0.25 -> 1.75). lr >= 1e-3 collapses this tiny model to unterminated answers (reward 0);
    at temperature 1.0 every answer scores 0, so no group has an advantage."""
    from datasets import Dataset
    from test_training_sft import _learnable_base, init_sft_rows, sft_config

    from monailabel_xflow.training.config import load_config
    from monailabel_xflow.training.grpo import train_grpo
    from monailabel_xflow.training.sft import train_sft

    base = _learnable_base(tmp_path / "vlm")
    rows = [r for r in init_sft_rows(tmp_path / "data", 12) if not r["positive"]]
    cfg = sft_config(max_steps=150, effective_batch=2, learning_rate=2e-2, aux_mask_loss_weight=1.0, seed=0)
    train_sft("init-sft", Dataset.from_list(rows), base, tmp_path / "sft", cfg, progress=False)
    batch = [
        dict(image=r["image"], prompt=r["prompt"], instruction=r["instruction"], gt_boxes=[], case_id=r["case_id"])
        for r in rows[:4]
    ]
    temperature, max_new, seeds = 0.3, 80, range(8)
    before = _mean_init_reward(base, tmp_path / "sft", batch, seeds, temperature, max_new)
    cfg = load_config(
        "init-rl",
        max_steps=6,
        effective_batch=16,
        num_generations=4,
        learning_rate=3e-4,
        lora_r=8,
        lora_alpha=16,
        kl_beta=0.0,
        temperature=temperature,
        seed=0,
    )
    summary = train_grpo(
        "init-rl",
        Dataset.from_list(batch),
        base,
        tmp_path / "rl",
        tmp_path / "sft",
        cfg,
        max_new_tokens=max_new,
        progress=False,
    )
    after = _mean_init_reward(base, tmp_path / "rl", batch, seeds, temperature, max_new)
    per_step = summary["reward"]
    print(
        f"\nπ_init GRPO mean R_init on the fixed batch {before:.3f} -> {after:.3f} after {summary['steps']} "
        f"steps; reward per step {np.round(per_step, 3).tolist()}"
    )
    assert summary["steps"] == 6 and len(per_step) == 6
    assert np.mean(per_step[-2:]) > per_step[0] + 0.5, per_step
    assert after > before + 0.3, (before, after)
