"""Training ROSALIA with the paper's recipe on phantoms (monailabel_xflow.rosalia.training).

The learning check trains a tiny ROSALIA for a few dozen steps on phantom questions and scores
questions of phantoms it never saw, before and after: the training loss falls and the held-out
loss (every term, as inference sees the input) falls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from monailabel_xflow.rosalia.model import RosaliaModel
from monailabel_xflow.rosalia.training import (
    RosaliaCollator,
    RosaliaDataset,
    RosaliaTrainConfig,
    apply_recipe,
    examples_from_spec,
    pretrain_sam,
    train_rosalia,
)

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_rosalia):
    from monailabel_xflow.data.export import export_set

    root = tmp_path_factory.mktemp("rosalia_train")
    export_set(root / "train", 10, 7, size=128)
    export_set(root / "heldout", 3, 1000, size=128)
    spec = f"mimic-ils:{root / 'train' / 'ground-truth' / 'mimic_ils.json'}"
    train = examples_from_spec(spec, ("train", "val", "test"))
    held = examples_from_spec(
        f"mimic-ils:{root / 'heldout' / 'ground-truth' / 'mimic_ils.json'}", ("train", "val", "test")
    )
    rng = np.random.default_rng(0)
    pos = [e for e in held if e.positive]
    neg = [e for e in held if not e.positive]
    held = [pos[i] for i in rng.choice(len(pos), 8, replace=False)] + [
        neg[i] for i in rng.choice(len(neg), 8, replace=False)
    ]
    return root, spec, train, held, tiny_rosalia


def test_examples_carry_rosalias_answers(data):
    _, _, train, _, _ = data
    kinds = {(e.instruction.kind, e.positive) for e in train}
    assert {("basic", True), ("basic", False), ("global", True), ("global", False)} <= kinds
    located = [e for e in train if e.instruction.kind == "global" and e.positive]
    assert all(e.answer.startswith("It is located in the ") for e in located)
    assert all(e.answer == "" for e in train if e.instruction.kind == "basic" and e.positive)
    assert all(e.answer == e.instruction.absent_answer() for e in train if not e.positive)


def test_batches_are_one_to_one_and_padded_for_the_loss(data):
    _, _, train, _, base = data
    model = RosaliaModel.from_pretrained(base)
    ds = RosaliaDataset(train, model.encoder, equalize_p=0.5, seed=0)
    n_pos = sum(e.positive for e in train)
    assert len(ds) == 2 * n_pos
    items = [ds[i] for i in (0, 1, n_pos, n_pos + 1)]
    assert [bool(i["mask"].any()) for i in items] == [True, True, False, False]
    batch = RosaliaCollator(model.tokenizer.pad_token_id)(items)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    for r, item in enumerate(items):
        pos = item["seg_position"]
        assert batch["input_ids"][r, pos + 1] == model.seg_token_id and batch["labels"][r, pos] == -100
        assert batch["attention_mask"][r].sum() == len(item["input_ids"])
    out = model(**batch)
    assert out["positives"] == 2 and torch.isfinite(out["loss"])
    assert torch.allclose(out["loss"], 0.5 * out["ce"] + 5 * out["bce"] + out["dice"], atol=1e-5)


def test_recipe_trains_what_the_paper_trains(data):
    *_, base = data
    model = RosaliaModel.from_pretrained(base)
    apply_recipe(model, RosaliaTrainConfig(lora_r=4, lora_alpha=8))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("language_model" in n and "lora_A" in n and "q_proj" in n for n in trainable)
    assert any(n.endswith("down_proj.lora_B.default.weight") for n in trainable)
    assert not any("vision_tower" in n and "lora" in n for n in trainable)  # LoRA on the LLM only
    assert any(n.endswith("embed_tokens.weight") for n in trainable) and any(
        n.endswith("lm_head.weight") for n in trainable
    )
    assert all(p.requires_grad for p in model.sam.mask_decoder.parameters())
    assert all(p.requires_grad for p in model.text_hidden_fcs.parameters())
    frozen = [model.sam.vision_encoder, model.sam.prompt_encoder]
    assert not any(p.requires_grad for m in frozen for p in m.parameters())
    assert not any(p.requires_grad for n, p in model.named_parameters() if "vision_tower" in n or "multi_modal" in n)


def test_learning_check_loss_falls_and_heldout_improves(data, tmp_path):
    _, _, train, held, base = data
    cfg = RosaliaTrainConfig(steps=40, batch=4, lr=3e-3, warmup=4, lora_r=8, lora_alpha=16, seed=0)
    log = train_rosalia(base, train, tmp_path / "trained", cfg, heldout=held, progress=False)
    losses = [row["loss"] for row in log["losses"]]
    assert len(losses) == 40 and np.mean(losses[-8:]) < 0.7 * np.mean(losses[:8])
    before, after = log["heldout_loss_before"], log["heldout_loss_after"]
    assert after["loss"] < 0.7 * before["loss"] and after["ce"] < before["ce"] and after["bce"] < before["bce"]
    saved = json.loads((tmp_path / "trained" / "rosalia_training.json").read_text())
    assert saved["heldout_after"]["n"] == 16 and saved["config"]["lr"] == 3e-3
    trained = RosaliaModel.from_pretrained(tmp_path / "trained")  # LoRA merged: a plain ROSALIA folder
    assert not any("lora" in k for k in trained.state_dict())


def test_cli_runs_under_accelerate_launch(data, tmp_path):
    _, spec, *_, base = data
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(REPO / "configs/accelerate/cpu.yaml"),
        "-m",
        "monailabel_xflow.cli",
        "train",
        "rosalia",
        "--model",
        str(base),
        "--data",
        spec,
        "--out",
        str(tmp_path / "out"),
        "--steps",
        "2",
        "--batch",
        "2",
        "--lora-r",
        "4",
        "--no-progress",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and (tmp_path / "out" / "rosalia.json").is_file()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "monailabel_xflow.cli",
            "train",
            "rosalia",
            "--model",
            str(base),
            "--data",
            "mimic-ils:/no/such.json",
            "--out",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert bad.returncode == 2 and "no/such.json" in bad.stderr


def test_sam_pretraining_learns_box_prompted_masks_and_trains_only_sam(data, tmp_path):
    """The demo's stand-in for SAM's own pre-training: loss falls, only SAM's weights move."""
    _, _, train, _, base = data
    before = RosaliaModel.from_pretrained(base)
    log = pretrain_sam(base, train, tmp_path / "sam", steps=40, batch=4, lr=3e-3, progress=False)
    after = RosaliaModel.from_pretrained(tmp_path / "sam")
    first, last = np.mean(log["losses"][:5]), np.mean(log["losses"][-5:])
    assert last < 0.8 * first, (first, last)

    def moved(a, b):
        return any(not torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))

    assert moved(before.sam, after.sam)
    assert not moved(before.llava, after.llava)
    assert not moved(before.text_hidden_fcs, after.text_hidden_fcs)
    with pytest.raises(ValueError, match="positive"):
        pretrain_sam(base, [e for e in train if not e.positive], tmp_path / "none", steps=1, progress=False)
