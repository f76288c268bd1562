"""Active learning keeps clicks alive (issue 33): the train task fine-tunes F_seg with SAM's
interactive recipe, and a candidate that lost click response is kept aside even when its box-only
IoU rose.

The click-deaf candidate is the previous demo F_seg (``tests/data/fseg-box-only``: trained on box
prompts, 4,500 steps, plus 400 revision-aware steps; main at fd0051f), whose clicks sent as a
client sends them make its masks worse, fine-tuned here once more box-only, on the held-out
components themselves, so that its box-only IoU rises above the serving segmenter's and only the
click check can stop it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow.workflow.model_config import DEMO_DIR

SAMPLE = Path(__file__).resolve().parents[1] / "sample-data"
HELD = ["phantom_1_00002", "phantom_1_00004", "phantom_1_00009", "phantom_1_00010"]


@pytest.fixture(scope="module")
def held():
    """``[(image, [(box, component)])]`` of four sample-data phantoms (seed 1), as the check reads labels."""
    from monailabel_xflow.training.promotion import component_prompts
    from monailabel_xflow.transforms.loading import load_cxr

    entries = {e["image"]: e for e in json.loads((SAMPLE / "ground-truth" / "phantoms.json").read_text())}
    out = []
    for study in HELD:
        image, _ = load_cxr(SAMPLE / f"{study}.png")
        label = np.zeros(image.shape, np.uint8)
        for k, lesion in enumerate(entries[f"{study}.png"]["lesions"]):
            mask = np.asarray(Image.open(SAMPLE / "ground-truth" / "lesion_mask" / lesion["mask"])) > 0
            label[mask] = k + 1
        out.append((image, component_prompts(label)))
    return out


BOX_ONLY = Path(__file__).resolve().parent / "data" / "fseg-box-only"


def fine_tune_box_only(src: Path, held, out: Path, steps: int = 60) -> Path:
    """The project trainer on the held-out components, box prompts only (no clicks, no rounds)."""
    from monailabel_xflow.training.config import SegmenterTrainConfig
    from monailabel_xflow.training.segmenter import SegSample, finetune_segmenter

    samples = [SegSample(image, truth) for image, prompts in held for _, truth in prompts]
    cfg = SegmenterTrainConfig(
        learning_rate=5e-4,
        max_steps=steps,
        effective_batch=1,
        points_per_prompt=0,
        interactive_rounds=0,
        focal_weight=1.0,
        freeze_encoder=True,
    )
    finetune_segmenter(src, samples, out, cfg, progress=False)
    return out


def test_a_candidate_fine_tuned_into_click_deafness_is_kept_aside(held, tmp_path):
    from monailabel_xflow.training.promotion import PROMOTION_CLICKS, heldout_scores, promotion_check

    serving = DEMO_DIR / "segmenter"
    deaf = fine_tune_box_only(BOX_ONLY, held, tmp_path / "deaf")
    before, after = heldout_scores(serving, held), heldout_scores(deaf, held)
    print("serving", before, "deaf candidate", after)
    assert after["box"] >= before["box"]  # the box-only check alone would promote it
    assert after["clicks"] < before["clicks"] - 0.05  # clicks do not steer it

    check = promotion_check(serving, deaf, held)
    assert not check["promoted"]
    assert "lost click response" in check["reason"] and f"after {PROMOTION_CLICKS} clicks" in check["reason"]
    assert check["heldout_iou_candidate"] >= check["heldout_iou_current"]
    assert check["heldout_iou_clicks_candidate"] < check["heldout_iou_clicks_current"]


def test_the_train_task_fine_tunes_with_the_interactive_recipe(tmp_path, monkeypatch, held):
    """``finetune_from_labels`` passes ``interactive_rounds`` (the train request's option, default
    :data:`TRAIN_DEFAULTS`) and the demo's interactive settings to the F_seg trainer."""
    from monailabel_xflow.task_options import TRAIN_DEFAULTS
    from monailabel_xflow.training import promotion, segmenter

    seen = []

    def capture(model_path, samples, out_dir, cfg=None, progress=True, on_step=None):
        seen.append(cfg)
        raise RuntimeError("stop after the config")

    monkeypatch.setattr(segmenter, "finetune_segmenter", capture)
    image, prompts = held[0]
    label = np.zeros(image.shape, np.uint8)
    for k, (_, truth) in enumerate(prompts):
        label[truth] = k + 1
    Image.fromarray((image * 255).astype(np.uint8)).save(tmp_path / "a.png")
    Image.fromarray(label).save(tmp_path / "a_label.png")
    pair = {"image": str(tmp_path / "a.png"), "label": str(tmp_path / "a_label.png")}
    for rounds in (TRAIN_DEFAULTS["interactive_rounds"], 0):
        with pytest.raises(RuntimeError, match="stop after"):
            promotion.finetune_from_labels([pair], DEMO_DIR / "segmenter", tmp_path / "out", interactive_rounds=rounds)
        assert seen[-1].interactive_rounds == rounds
        for key, value in promotion.INTERACTIVE_SETTINGS.items():
            assert getattr(seen[-1], key) == value
    assert TRAIN_DEFAULTS["interactive_rounds"] > 0
