"""The ROSALIA demo: a demo-size ROSALIA trained on the XFlow demo's phantoms (``xflow train rosalia-demo``).

Like the XFlow demo (:mod:`monailabel_xflow.training.demo`) it exists so that the app's ``rosalia``
task works out of the box, on synthetic phantoms only (**not** for clinical images):

1. **Data**: the XFlow demo's phantom training set (same seed, count and size:
   :class:`~monailabel_xflow.training.demo.DemoRecipe` defaults), every split, basic, global and
   lesion-inference questions with their MIMIC-ILS answers
   (:func:`~monailabel_xflow.rosalia.training.examples_from_spec`).
2. **Model**: a random ROSALIA of the ``demo`` size (:mod:`monailabel_xflow.rosalia.configs`).
   Its SAM half is first trained alone on box prompts of the training lesions
   (:func:`~monailabel_xflow.rosalia.training.pretrain_sam`, ``sam_steps``): the stand-in for the
   pretrained SAM ViT-H that LISA and ROSALIA start from. Without it the random mask decoder,
   reached only through the ``[SEG]`` prompt, settled on empty masks (the first demo, 300 steps).
3. **Training**: :func:`~monailabel_xflow.rosalia.training.train_rosalia`, the paper's recipe
   (loss 0.5/5/1, 1:1 positives/negatives, LoRA on the language model, equalisation p = 0.5,
   AdamW 0.9/0.95, linear warm-up/decay) with two deviations a random model needs: CLIP, the
   projector and SAM's image encoder are trained too (the paper starts from pretrained LISA, whose
   encoders are not random), and the learning rate is 1e-3.
4. **Held-out check**: questions of :func:`~monailabel_xflow.training.demo.export_heldout`
   (phantoms of seed 1000, never trained on), scored with the papers' metrics.
5. **Packaging**: ``OUT/model`` (a ROSALIA folder stored in float16, the model card ``README.md``,
   ``recipe.json``); ``--install`` copies it to :data:`monailabel_xflow.rosalia.weights.ROSALIA_DEMO_DIR`.

Command (documented in the README; the committed demo is this default recipe: 1,200 SAM steps
and 1,500 ROSALIA steps)::

    nice -n 10 xflow train rosalia-demo --out /tmp/rosalia-demo --install
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class RosaliaDemoRecipe:
    """Sizes and steps of the demo (defaults: the committed demo).

    Attributes:
        seed: phantoms (the XFlow demo's seed), weights, data order.
        train_studies / phantom_size: the phantom training set (the XFlow demo's).
        size: ROSALIA size (:data:`monailabel_xflow.rosalia.configs.SIZES`).
        steps, batch, lr, warmup, lora_r, lora_alpha: training (see :class:`RosaliaTrainConfig`).
        heldout_questions: held-out questions scored at the end (0: none).
        minutes: wall-clock cap on training (steps stop early when reached; 0: none).
        sam_steps, sam_lr: box-prompted pre-training of the SAM half first (0: none).
    """

    seed: int = 0
    train_studies: int = 240
    phantom_size: int = 256
    size: str = "demo"
    steps: int = 1500
    batch: int = 8
    lr: float = 1e-3
    warmup: int = 100
    lora_r: int = 32
    lora_alpha: int = 64
    heldout_questions: int = 60
    minutes: float = 0.0
    sam_steps: int = 1200
    sam_lr: float = 1e-3

    def __post_init__(self) -> None:
        from monailabel_xflow.training.config import check_int_fields

        check_int_fields(self, ("train_studies", "phantom_size", "steps", "batch", "lora_r", "lora_alpha"))


QUICK = RosaliaDemoRecipe(
    train_studies=6,
    size="tiny",
    steps=3,
    batch=2,
    warmup=1,
    lora_r=4,
    lora_alpha=8,
    heldout_questions=6,
    phantom_size=128,
    sam_steps=2,
)
"""The whole recipe at toy scale (smoke checks): learns nothing."""


def train_rosalia_demo(out: str | Path, recipe: RosaliaDemoRecipe | None = None, progress: bool = True) -> Path:
    """Run the recipe into ``out``; returns the packaged ROSALIA folder ``out/model``."""
    from monailabel_xflow.rosalia.configs import build_random_rosalia
    from monailabel_xflow.rosalia.model import RosaliaModel
    from monailabel_xflow.rosalia.training import (
        RosaliaTrainConfig,
        examples_from_spec,
        json_safe,
        pretrain_sam,
        train_rosalia,
    )
    from monailabel_xflow.training.demo_data import export_heldout, export_phantoms

    recipe = recipe or RosaliaDemoRecipe()
    out = Path(out)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    json_path = export_phantoms(
        work / "phantoms", recipe.train_studies, recipe.seed, recipe.phantom_size, progress, "training phantoms"
    )
    examples = examples_from_spec(f"mimic-ils:{json_path}", ("train", "val", "test"))
    heldout = []
    if recipe.heldout_questions:
        held_json = export_heldout(
            work / "heldout", questions=recipe.heldout_questions, size=recipe.phantom_size, progress=progress
        )
        heldout = examples_from_spec(f"mimic-ils:{held_json}", ("test",), kinds=("basic", "global"))
    base = build_random_rosalia(work / "base", recipe.size, seed=recipe.seed)
    sam_log = None
    if recipe.sam_steps:
        sam_log = pretrain_sam(
            base,
            examples,
            work / "base-sam",
            steps=recipe.sam_steps,
            batch=recipe.batch,
            lr=recipe.sam_lr,
            seed=recipe.seed,
            progress=progress,
        )
        base = work / "base-sam"
    cfg = RosaliaTrainConfig(
        steps=recipe.steps,
        batch=recipe.batch,
        lr=recipe.lr,
        warmup=recipe.warmup,
        lora_r=recipe.lora_r,
        lora_alpha=recipe.lora_alpha,
        train_vision=True,
        train_sam_encoder=True,
        seed=recipe.seed,
    )
    trained = work / "trained"
    log = train_rosalia(
        base, examples, trained, cfg, heldout=heldout, progress=progress, max_seconds=recipe.minutes * 60 or None
    )
    model_dir = out / "model"
    if model_dir.exists():
        shutil.rmtree(model_dir)
    import torch

    RosaliaModel.from_pretrained(trained).save_pretrained(model_dir, dtype=torch.float16)
    info = {
        "recipe": dataclasses.asdict(recipe),
        "examples": len(examples),
        "positives": sum(e.positive for e in examples),
        "steps_done": len(log["losses"]),
        "train_seconds": round(log["seconds"], 1),
        "total_seconds": round(time.perf_counter() - t0, 1),
        "first_loss": log["losses"][0],
        "last_loss": log["losses"][-1],
        "sam_pretraining": sam_log
        and {
            "steps": len(sam_log["losses"]),
            "seconds": round(sam_log["seconds"], 1),
            "first_loss": sam_log["losses"][0],
            "last_loss": sam_log["losses"][-1],
        },
        "heldout": {k: log.get(k) for k in ("heldout_before", "heldout_after")},
    }
    (model_dir / "recipe.json").write_text(json.dumps(json_safe(info), indent=1, default=str) + "\n")
    (model_dir / "README.md").write_text(model_card(info))
    return model_dir


def _metric(d: Any, key: str) -> str:
    v = (d or {}).get(key)
    return "n/a" if v is None else f"{v:.3f}"


REFERENCE_DIFFERENCES = """## Inference against the public ROSALIA code, and what still differs

Inference follows the public code (KAIST-Edlab/ROSALIA: `inference_rosalia_example.py`, LISA's
`tokenizer_image_token`; pinned by `tests/test_rosalia_reference.py`):

- **Images as given**: no histogram equalisation at inference (the released inference and
  evaluation code read the image and hand its pixels on; equalisation, p = 0.5, is a training
  augmentation). `RosaliaPredictor(equalise=True)` gives the research snapshots' evaluation, which
  read pre-equalised PNGs. `rosalia.json`'s `"equalize": true` records the training augmentation.
- **Prompt ids as the reference builds them** (`rosalia.templates.reference_ids`): the `llava_v1`
  prompt split around `<image>`, each chunk tokenised on its own, `<s>` once, the whitespace next to
  LISA's added tokens (`[SEG]`, `<im_start>`, `<im_end>`) stripped as its slow tokenizer does.

What still differs:

- **This model's tokenisation is its training's**: it was trained before the reference tokenisation
  existed, on the whole prompt tokenised at once (`rosalia.json` has no `tokenisation` key, read as
  `"whole-prompt"`), and is run that way: its ids keep the space before `<im_start>`, the newline
  after `<im_end>` and the space after `[SEG]` that the reference strips. Models trained now, and
  LISA / ROSALIA checkpoints converted by `rosalia.checkpoint`, record and use `"reference"`.
- **No slow tokenizer**: transformers 5 has no SentencePiece-backed slow Llama tokenizer; the
  reference's behaviour is reproduced on the fast tokenizer (pieces tokenised separately get their
  own prefix `▁`, as SentencePiece's dummy prefix). The demo's tokenizer is a byte-level BPE on the
  phantom questions, not Llama's.
- **Size and pretraining**: 2.9 M parameters, every part trained from nothing on 240 phantoms
  (LISA-7B: pretrained LLaVA-7B and SAM ViT-H; LoRA r 128 there, 32 here).
- **SAM resize**: ResizeLongestSide is torch's antialiased bilinear here, PIL's in the reference
  (the same sizes and rounding; pixel values differ slightly).
- **Answer length**: at most 32 new tokens (512 in the reference); answers start with `[SEG]`, so
  the mask never depends on it.
"""
"""The model card's account of how inference matches the public code (kept when the card is rewritten)."""


def model_card(info: dict[str, Any]) -> str:
    """The demo's README: what it is, how it was made, what it reaches on held-out phantoms."""
    r = info["recipe"]
    after = (info.get("heldout") or {}).get("heldout_after")
    defaults = dataclasses.asdict(RosaliaDemoRecipe())
    flags = "".join(
        f" --{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f" --{k.replace('_', '-')} {v}"
        for k, v in r.items()
        if k in defaults and defaults[k] != v
    )
    empty = (
        "\n\n**At this budget its masks stayed empty**: it found no lesion in the held-out phantoms "
        "(every question read as absent), so it exercises the `rosalia` task end to end but is no "
        "baseline to compare accuracy with; train longer, or pre-train the SAM half longer."
        if after and after.get("n_positive") and not after.get("tp")
        else ""
    )
    if after and after.get("n_negative") and not after.get("tn"):
        empty += (
            "\n\n**It draws a mask for every question**: no held-out negative was answered absent "
            "(N-Acc 0), so its presence answers carry no information at this budget."
        )
    return (
        "# ROSALIA demo model (rosalia-demo-phantoms)\n\n"
        "A demo-size ROSALIA (LLaVA + SAM joined by the [SEG] token, `monailabel_xflow.rosalia`) trained on "
        "synthetic phantom radiographs only. **Not for clinical images.** It lets the app's `rosalia` task run "
        "out of the box beside the XFlow demo.\n\n"
        f"Rebuild: `nice -n 10 xflow train rosalia-demo --out DIR --install{flags}` (seed {r['seed']}, "
        f"{r['train_studies']} phantoms of {r['phantom_size']} px: the XFlow demo's; size `{r['size']}`, "
        f"{info['steps_done']} steps of batch {r['batch']}, lr {r['lr']}, LoRA r {r['lora_r']}; "
        f"{info['train_seconds']} s of training). Recipe: the paper's (loss 0.5 CE + 5 BCE + 1 Dice on positives, "
        "1:1 positives/negatives, LoRA on the language model, histogram equalisation p = 0.5) with CLIP, the "
        "projector and SAM's image encoder also trained (nothing here is pretrained)"
        + (
            f", after {info['sam_pretraining']['steps']} steps of box-prompted training of the SAM half alone "
            "(the stand-in for the pretrained SAM ViT-H that ROSALIA starts from)"
            if info.get("sam_pretraining")
            else ""
        )
        + ".\n\n"
        f"Held-out phantom questions (n = {after['n'] if after else 0}): "
        f"gIoU {_metric(after, 'giou')}, cIoU {_metric(after, 'ciou')}, N-Acc {_metric(after, 'n_acc')}, "
        f"F1 {_metric(after, 'f1')}.{empty}\n\n"
        "Weights are stored in float16 (loaded as float32). Details: `recipe.json`.\n\n" + REFERENCE_DIFFERENCES
    )


def install(model_dir: str | Path) -> Path:
    """Copy a packaged demo to :data:`monailabel_xflow.rosalia.weights.ROSALIA_DEMO_DIR` (replacing it)."""
    from monailabel_xflow.rosalia.weights import ROSALIA_DEMO_DIR

    if ROSALIA_DEMO_DIR.exists():
        shutil.rmtree(ROSALIA_DEMO_DIR)
    shutil.copytree(model_dir, ROSALIA_DEMO_DIR)
    return ROSALIA_DEMO_DIR
