"""Vision-tower pre-training (training/vision_pretrain.py): it learns, and what it trains on is what
inference feeds the policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from monailabel_xflow.instructions import Instruction

EFFUSION = Instruction("effusion", kind="global")
LEFT = Instruction("effusion", kind="basic", regions=("left lung",))


def _rows(root: Path, n: int, start: int = 0) -> list[dict]:
    """init-sft-like rows: per phantom (effusion in even ones) a chest-level and a left-lung effusion
    question, with the per-finding masks the builder attaches."""
    from test_training_sft import phantom_cases

    from monailabel_xflow.vocabulary import FINDINGS

    rows = []
    for ph, img, mask in phantom_cases(root, n, 128, start):
        masks = ["" if f != "effusion" or mask is None else mask for f in FINDINGS]
        left = ph.finding_mask("effusion") & ph.lungs["left lung"]
        for ins, positive in ((EFFUSION, mask is not None), (LEFT, bool(left.any()))):
            rows.append(dict(image=img, instruction=ins.text, positive=positive, finding_masks=masks))
    return rows


def test_vision_pixels_are_the_policys_inference_pixels(tmp_path, tiny_vlm):
    from monailabel_xflow.policy.vlm import VLMPolicy
    from monailabel_xflow.training.vision_pretrain import question_key, vision_set
    from monailabel_xflow.transforms import load_cxr

    rows = _rows(tmp_path, 2)
    policy = VLMPolicy.from_pretrained(tiny_vlm.base)
    data = vision_set(rows, policy.processor, side=2)
    enc = policy.stage1_inputs(load_cxr(rows[0]["image"])[0], EFFUSION)
    assert np.allclose(data.pixels[0].numpy(), enc.pixel_values[0].numpy())
    assert data.keys == sorted({question_key(r) for r in rows}) == ["effusion|chest|", "effusion|lung|left lung"]
    assert data.questions.shape == (2, 2) and data.cells.shape == (2, 4, 7)
    # phantom 0 has an effusion (its chest question is positive and some cell holds it), phantom 1 none
    assert data.questions[0, 0] == 1 and data.questions[1].tolist() == [0.0, 0.0]
    assert data.cells[0].sum() > 0 and data.cells[1].sum() == 0


def test_vision_pretraining_raises_held_out_presence_accuracy(tmp_path, tiny_vlm):
    """60 steps on 30 phantoms take the presence head's balanced accuracy on 10 held-out phantoms
    from chance (0.5) to near perfect, and the pre-trained base loads and runs as a policy."""
    from monailabel_xflow.policy.vlm import VLMPolicy
    from monailabel_xflow.training.vision_pretrain import pretrain_vision
    from monailabel_xflow.transforms import load_cxr

    rows = _rows(tmp_path / "ph", 40)
    summary = pretrain_vision(tiny_vlm.base, rows, tmp_path / "pre", 60, batch=8, lr=3e-3, holdout=0.25, progress=False)
    before, after = summary["held_out_before"], summary["held_out_after"]
    print(
        f"\nvision pre-training: loss {summary['loss_first_last']}, held-out balanced accuracy "
        f"{before['balanced_accuracy']:.3f} -> {after['balanced_accuracy']:.3f}"
    )
    assert summary["held_out_images"] == 10 and summary["images"] == 30
    first, last = summary["loss_first_last"]
    assert last < 0.6 * first
    assert before["balanced_accuracy"] <= 0.6 and after["balanced_accuracy"] >= 0.8, (before, after)
    assert (tmp_path / "pre" / "xflow_vision.json").is_file()
    policy = VLMPolicy.from_pretrained(tmp_path / "pre")
    assert isinstance(policy.stage1(load_cxr(rows[0]["image"])[0], EFFUSION), str)
