"""Training ROSALIA with the paper's recipe, on one CPU or under accelerate.

Recipe (ROSALIA / LISA ``train_ds.py``; :class:`RosaliaTrainConfig` holds the numbers):

* loss = 0.5 text cross-entropy + 5 mask BCE (per-pixel mean, every row) + 1 Dice (sigmoid,
  scale 1000, eps 1e-6; rows with a non-empty mask only) (:meth:`RosaliaModel.forward`);
* 1:1 positives and negatives: an epoch is 2 x #positives indices; index ``i < #pos`` is positive
  ``i``, any other index a random negative (:class:`RosaliaDataset`);
* LoRA (r 128, alpha 256, dropout 0.05) on every linear layer of the language model (peft);
  ``embed_tokens``, ``lm_head``, SAM's mask decoder and ``text_hidden_fcs`` fully trained; CLIP, the
  projector and SAM's image and prompt encoders frozen
  (the paper's text, §5-6.1; the public ``train.sh`` also passes ``--lora_sam_encoder``, LoRA on SAM's
  image encoder merged into the release, which :mod:`~monailabel_xflow.rosalia.checkpoint` reads
  the same way; not used here);
* AdamW (0.9, 0.95), weight decay 0, gradient clipping 1.0, peak lr 3e-4, 100 warm-up steps then
  linear decay to 0;
* histogram equalisation with p = 0.5 (inference does not equalise, as in the public code);
* questions phrased the builders' ways (:func:`monailabel_xflow.training.builders.phrasings`),
  answers in ROSALIA's templates; input built by :class:`~monailabel_xflow.rosalia.model.RosaliaEncoder`,
  the same code the predictor uses.

Data come from the datasets the XFlow builders read (``mimic-ils:JSON[:ROOT]``, e.g. a phantom set
written by ``xflow phantom``): :func:`examples_from_spec`.

At the end the LoRA weights are merged (as LISA's release script does) and the model is saved as a
ROSALIA folder with ``rosalia_training.json`` (config, loss history, held-out metrics if asked).

Run: ``xflow train rosalia --model BASE --data SPEC --out DIR`` (its parser:
:mod:`monailabel_xflow.commands.train`) or, on more processes,
``accelerate launch --config_file configs/accelerate/cpu.yaml -m monailabel_xflow.cli train rosalia ...``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from monailabel_xflow.instructions import Instruction
from monailabel_xflow.rosalia.configs import RosaliaTrainConfig
from monailabel_xflow.rosalia.model import (
    BCE_WEIGHT,
    DICE_WEIGHT,
    IGNORE_INDEX,
    RosaliaEncoder,
    RosaliaModel,
    dice_loss,
)
from monailabel_xflow.rosalia.templates import read_answer

logger = logging.getLogger(__name__)

LOG_NAME = "rosalia_training.json"
LORA_TARGET_MODULES = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
"""Every linear layer of the language model (not CLIP's, which also has ``q_proj``...)."""


# --- data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RosaliaExample:
    """One question: the image, the instruction, ROSALIA's answer sentence, the mask (positives)."""

    image_path: Path
    instruction: Instruction
    answer: str
    mask_path: Path | None = None

    @property
    def positive(self) -> bool:
        return self.mask_path is not None


def examples_from_cases(cases: Iterable, answers: dict[str, str] | None = None) -> list[RosaliaExample]:
    """ROSALIA examples from :class:`~monailabel_xflow.data.readers.EvalCase` questions.

    Args:
        cases: questions read by :func:`~monailabel_xflow.data.readers.read_dataset` or ``read_mimic_ils``.
        answers: ``pair_id -> answer sentence`` (MIMIC-ILS ``answer`` fields); without one, a negative
            gets the absent sentence and a basic positive ``""``; global / lesion-inference positives
            without an answer are skipped (their sentence names what the data must say).
    """
    out = []
    answers = answers or {}
    for case in cases:
        instr = case.instruction
        sentence = answers.get(str(case.meta.get("pair_id")))
        if sentence is None:
            if not case.positive:
                sentence = instr.absent_answer()
            elif instr.kind == "basic":
                sentence = ""
            else:
                continue
        read = read_answer(f"[SEG] {sentence}", instr)
        if read.says_present is None or read.says_present != case.positive:
            logger.warning("skipping %s: answer %r does not fit the question", case.case_id, sentence)
            continue
        out.append(
            RosaliaExample(Path(case.image_path), instr, read.sentence, Path(case.mask_path) if case.positive else None)
        )
    return out


def examples_from_spec(
    spec: str, splits: Sequence[str] = ("train",), kinds: Sequence[str] = ("basic", "global", "lesion_inference")
) -> list[RosaliaExample]:
    """Examples of a dataset spec (``mimic-ils:JSON[:ROOT]``, ``folder:DIR``...) over ``splits``."""
    from monailabel_xflow.data.readers import read_dataset

    answers: dict[str, str] = {}
    if spec.startswith("mimic-ils:"):
        json_path = Path(spec.split(":")[1])
        for split in json.loads(json_path.read_text()).values():
            for entry in split.values():
                for key in ("positive_pairs", "negative_pairs"):
                    for pair in entry["instruction_answer_pairs"].get(key) or []:
                        if "pair_id" in pair and "answer" in pair:
                            answers[str(pair["pair_id"])] = pair["answer"]
    out: list[RosaliaExample] = []
    for split in splits:
        out += examples_from_cases(read_dataset(spec, split=split, kinds=kinds).cases, answers)
    return out


def load_example(example: RosaliaExample) -> tuple[np.ndarray, np.ndarray]:
    """``(image (H, W) float in [0, 1], mask (H, W) bool)`` of an example (the loaders XFlow uses)."""
    from monailabel_xflow.data.readers import read_mask_png
    from monailabel_xflow.geometry import resize_mask
    from monailabel_xflow.transforms import load_cxr

    image, _ = load_cxr(example.image_path)
    if example.mask_path is None:
        return image, np.zeros(image.shape, bool)
    mask = read_mask_png(example.mask_path)
    return image, (mask if mask.shape == image.shape else resize_mask(mask, image.shape))


class RosaliaDataset(torch.utils.data.Dataset):
    """The paper's 1:1 sampling: ``len = 2 x #positives``; index < #pos -> that positive, else a
    random negative. Items are encoded by ``encoder`` (histogram equalisation with ``equalize_p``).

    Raises:
        ValueError: no positives or no negatives.
    """

    def __init__(
        self,
        examples: Sequence[RosaliaExample],
        encoder: RosaliaEncoder,
        equalize_p: float = 0.5,
        phrase: bool = True,
        seed: int = 0,
    ) -> None:
        self.pos = [e for e in examples if e.positive]
        self.neg = [e for e in examples if not e.positive]
        if not self.pos or not self.neg:
            raise ValueError(f"ROSALIA training needs positives and negatives (got {len(self.pos)} / {len(self.neg)})")
        self.encoder = encoder
        self.equalize_p = float(equalize_p)
        self.phrase = phrase
        self.rng = np.random.default_rng(seed)
        # Encoded images per (image, equalised) and masks per file: reading, equalising and
        # resizing cost more than a small model's step (~1 MB an image at the demo size).
        self._images: dict[tuple[Path, bool], Any] = {}
        self._masks: dict[Path | None, np.ndarray] = {}

    def __len__(self) -> int:
        return 2 * len(self.pos)

    def __getitem__(self, index: int) -> dict[str, Any]:
        from monailabel_xflow.instructions import phrasings

        ex = self.pos[index] if index < len(self.pos) else self.neg[int(self.rng.integers(len(self.neg)))]
        equalise = bool(self.rng.random() < self.equalize_p)
        key = (ex.image_path, equalise)
        if key not in self._images or ex.mask_path not in self._masks:
            image, mask = load_example(ex)
            self._images.setdefault(key, self.encoder.image(image, equalise=equalise))
            if ex.mask_path is not None:
                self._masks[ex.mask_path] = mask
        img = self._images[key]
        h, w = img.original
        mask = self._masks[ex.mask_path] if ex.mask_path is not None else np.zeros((h, w), bool)
        question = self.rng.choice(phrasings(ex.instruction)) if self.phrase else ex.instruction.text
        return training_item(img, self.encoder.text(str(question), ex.answer), mask)


def training_item(img: Any, txt: Any, mask: np.ndarray) -> dict[str, Any]:
    """One example as :class:`RosaliaCollator` takes it: the encoder's image and text (answer
    included) and the ``(H, W)`` ground-truth mask at the image's original size."""
    return {
        "input_ids": txt.input_ids,
        "labels": txt.labels,
        "seg_position": txt.prompt_length - 1,
        "clip_pixels": img.clip_pixels,
        "sam_pixels": img.sam_pixels,
        "resized": img.resized,
        "mask": torch.from_numpy(mask.astype(np.float32)),
    }


class RosaliaCollator:
    """Right-pads a list of :class:`RosaliaDataset` items into :meth:`RosaliaModel.forward` kwargs."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = int(pad_id)

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        n = max(len(i["input_ids"]) for i in items)
        ids = torch.full((len(items), n), self.pad_id, dtype=torch.long)
        labels = torch.full((len(items), n), IGNORE_INDEX, dtype=torch.long)
        attn = torch.zeros((len(items), n), dtype=torch.long)
        for r, item in enumerate(items):
            k = len(item["input_ids"])
            ids[r, :k], labels[r, :k], attn[r, :k] = item["input_ids"], item["labels"], 1
        return {
            "input_ids": ids,
            "attention_mask": attn,
            "labels": labels,
            "clip_pixels": torch.stack([i["clip_pixels"] for i in items]),
            "sam_pixels": torch.stack([i["sam_pixels"] for i in items]),
            "seg_positions": torch.tensor([i["seg_position"] for i in items]),
            "masks": [i["mask"] for i in items],
            "resized": [i["resized"] for i in items],
        }


# --- the recipe -------------------------------------------------------------------------------


def apply_recipe(model: RosaliaModel, cfg: RosaliaTrainConfig) -> list[torch.nn.Parameter]:
    """Wrap the language model with LoRA and set what trains; returns the trainable parameters."""
    from peft import LoraConfig, get_peft_model

    for p in model.parameters():
        p.requires_grad_(False)
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=LORA_TARGET_MODULES,
        bias="none",
    )
    model.llava = get_peft_model(model.llava, lora)
    for name, p in model.llava.named_parameters():
        if "lora_" in name or name.endswith(("embed_tokens.weight", "lm_head.weight")):
            p.requires_grad_(True)
        if cfg.train_vision and ("vision_tower" in name or "multi_modal_projector" in name):
            p.requires_grad_(True)
    for p in model.sam.mask_decoder.parameters():
        p.requires_grad_(True)
    for p in model.text_hidden_fcs.parameters():
        p.requires_grad_(True)
    if cfg.train_sam_encoder:
        for p in model.sam.vision_encoder.parameters():
            p.requires_grad_(True)
    return [p for p in model.parameters() if p.requires_grad]


def merge_recipe(model: RosaliaModel) -> RosaliaModel:
    """Fold the LoRA weights into the language model (what LISA's release script does)."""
    from peft import PeftModel

    if isinstance(model.llava, PeftModel):
        model.llava = model.llava.merge_and_unload()
    return model


def evaluate(model: RosaliaModel, examples: Sequence[RosaliaExample], max_new_tokens: int = 24) -> dict[str, Any]:
    """The papers' metrics of ``model`` on ``examples`` (:func:`monailabel_xflow.metrics.summarize`)."""
    from monailabel_xflow.metrics import sample_stats, summarize
    from monailabel_xflow.rosalia.predictor import RosaliaPredictor

    predictor = RosaliaPredictor(model, max_new_tokens=max_new_tokens)
    stats = []
    was_training = model.training
    model.eval()
    for ex in examples:
        image, gt = load_example(ex)
        predictor.set_image(image)
        mask, _, _ = predictor.predict(ex.instruction)
        stats.append(sample_stats(mask, gt if ex.positive else None))
    model.train(was_training)
    return summarize(stats)


def heldout_loss(model: RosaliaModel, examples: Sequence[RosaliaExample], batch: int = 8) -> dict[str, float]:
    """The training loss and its terms on ``examples``, as inference sees them (not equalised,
    canonical instructions, no dropout); means over the examples."""
    collate = RosaliaCollator(model.tokenizer.pad_token_id)
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {"loss": 0.0, "ce": 0.0, "bce": 0.0, "dice": 0.0}
    with torch.no_grad():
        for start in range(0, len(examples), batch):
            items = []
            for ex in examples[start : start + batch]:
                image, mask = load_example(ex)
                img = model.encoder.image(image, equalise=False)
                items.append(training_item(img, model.encoder.text(ex.instruction.text, ex.answer), mask))
            out = model(**collate(items))
            for k in sums:
                sums[k] += float(out[k]) * len(items)
    model.train(was_training)
    return {k: v / max(1, len(examples)) for k, v in sums.items()}


def train_rosalia(
    model_dir: str | Path,
    examples: Sequence[RosaliaExample],
    out: str | Path,
    cfg: RosaliaTrainConfig | None = None,
    heldout: Sequence[RosaliaExample] = (),
    progress: bool = True,
    max_seconds: float | None = None,
) -> dict[str, Any]:
    """Train a ROSALIA folder on ``examples`` and save the merged model to ``out``.

    Args:
        model_dir: the starting ROSALIA folder (random sizes, or a converted release).
        examples: training questions (positives and negatives).
        out: output folder (a ROSALIA folder plus :data:`LOG_NAME`).
        cfg: hyperparameters (default :class:`RosaliaTrainConfig`).
        heldout: questions scored before and after training: the papers' metrics
            (``heldout_before`` / ``heldout_after``) and the loss (``heldout_loss_before`` / ``_after``).
        progress: tqdm bar.
        max_seconds: stop early after this much training time (the schedule keeps ``cfg.steps``).

    Returns:
        The log: config, ``losses`` (per step: loss, ce, bce, dice), held-out metrics, seconds.
    """
    from accelerate import Accelerator
    from tqdm.auto import tqdm
    from transformers import get_linear_schedule_with_warmup

    cfg = cfg or RosaliaTrainConfig()
    accelerator = Accelerator()
    torch.manual_seed(cfg.seed)
    model = RosaliaModel.from_pretrained(model_dir)
    log: dict[str, Any] = {"config": dataclasses.asdict(cfg), "base": str(model_dir), "examples": len(examples)}
    if heldout and accelerator.is_main_process:
        log["heldout_before"] = evaluate(model, heldout)
        log["heldout_loss_before"] = heldout_loss(model, heldout)
    params = apply_recipe(model, cfg)
    log["trainable_parameters"] = sum(p.numel() for p in params)
    dataset = RosaliaDataset(examples, model.encoder, cfg.equalize_p, cfg.phrase, cfg.seed)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=cfg.batch,
        shuffle=True,
        collate_fn=RosaliaCollator(model.tokenizer.pad_token_id),
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=(float(cfg.betas[0]), float(cfg.betas[1])), weight_decay=cfg.weight_decay
    )
    schedule = get_linear_schedule_with_warmup(optimizer, min(cfg.warmup, cfg.steps // 2), cfg.steps)
    model.train()
    model.sam.vision_encoder.train(cfg.train_sam_encoder)
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)
    losses: list[dict[str, float]] = []
    t0 = time.perf_counter()
    bar = tqdm(total=cfg.steps, desc="ROSALIA", disable=not (progress and accelerator.is_main_process))
    step = 0
    while step < cfg.steps:
        for batch in loader:
            with accelerator.accumulate(model):
                out_ = model(**batch)
                accelerator.backward(out_["loss"])
                accelerator.clip_grad_norm_(params, cfg.clip)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
            row = {k: float(out_[k].detach()) for k in ("loss", "ce", "bce", "dice")}
            losses.append(row)
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.3f}", ce=f"{row['ce']:.3f}", dice=f"{row['dice']:.3f}")
            if step >= cfg.steps or (max_seconds and time.perf_counter() - t0 > max_seconds):
                step = cfg.steps
                break
    bar.close()
    log["losses"] = losses
    log["seconds"] = time.perf_counter() - t0
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        model = merge_recipe(accelerator.unwrap_model(model)).eval()
        if heldout:
            log["heldout_after"] = evaluate(model, heldout)
            log["heldout_loss_after"] = heldout_loss(model, heldout)
        out = Path(out)
        model.save_pretrained(out)
        (out / LOG_NAME).write_text(json.dumps(json_safe(log), indent=1) + "\n")
    return log


def pretrain_sam(
    model_dir: str | Path,
    examples: Sequence[RosaliaExample],
    out: str | Path,
    steps: int = 600,
    batch: int = 8,
    lr: float = 1e-3,
    equalize_p: float = 0.5,
    seed: int = 0,
    progress: bool = True,
    max_seconds: float | None = None,
) -> dict[str, Any]:
    """Box-prompted training of ROSALIA's SAM half alone: the stand-in for SAM's own pre-training.

    LISA and ROSALIA start from SAM ViT-H weights that already segment what a box points at; a
    random demo-size SAM does not, and the paper's recipe (whose loss reaches the mask decoder only
    through the ``[SEG]`` prompt) then settles on empty masks. This phase gives the random SAM that
    ability first, on the positives' lesion boxes (the whole mask's bounding box, jittered by up to
    10 % of its side), with the same image preparation as ROSALIA
    (:meth:`RosaliaEncoder.image`, equalisation with ``equalize_p``) and the same mask loss terms
    (5 BCE + 1 Dice, :func:`~monailabel_xflow.rosalia.model.dice_loss`). Only ``model.sam`` trains.

    Args:
        model_dir: a ROSALIA folder; ``out``: where the result is saved (a ROSALIA folder).
        examples: questions; only positives (with a mask) are used.
        steps, batch, lr: AdamW steps, boxes per step, learning rate (constant).
        max_seconds: stop early after this much training time.

    Returns:
        ``{"losses": [...], "seconds": s, "boxes": n}``; ``losses`` per step (5 BCE + 1 Dice).

    Raises:
        ValueError: no positive example.
    """
    from tqdm.auto import tqdm

    pos = [e for e in examples if e.positive]
    if not pos:
        raise ValueError("SAM pre-training needs positive examples (with masks)")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = RosaliaModel.from_pretrained(model_dir)
    for p in model.parameters():
        p.requires_grad_(False)
    params = [p for p in model.sam.parameters()]
    for p in params:
        p.requires_grad_(True)
    cache: dict[tuple[Path, bool], Any] = {}
    masks: dict[Path, np.ndarray] = {}

    def item(ex: RosaliaExample) -> tuple[Any, torch.Tensor, torch.Tensor]:
        equalise = bool(rng.random() < equalize_p)
        mask_path = ex.mask_path
        if mask_path is None:  # pos holds positives only
            raise ValueError(f"{ex.image_path}: a positive example without a mask")
        if (ex.image_path, equalise) not in cache or mask_path not in masks:
            image, mask = load_example(ex)
            cache[(ex.image_path, equalise)] = model.encoder.image(image, equalise=equalise)
            masks[mask_path] = mask
        img, mask = cache[(ex.image_path, equalise)], masks[mask_path]
        ys, xs = np.nonzero(mask)
        x1, x2, y1, y2 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1
        jitter = rng.uniform(-0.1, 0.1, 4) * np.array([x2 - x1, y2 - y1, x2 - x1, y2 - y1])
        (h, w), (rh, rw) = img.original, img.resized
        box = (np.array([x1, y1, x2, y2], float) + jitter) * np.array([rw / w, rh / h, rw / w, rh / h])
        box = np.clip(box, 0, [rw, rh, rw, rh])
        return img, torch.tensor(box, dtype=torch.float32), torch.from_numpy(mask.astype(np.float32))

    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95))
    model.sam.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    for _ in tqdm(range(steps), desc="SAM pre-training", disable=not progress):
        rows = [item(pos[int(i)]) for i in rng.integers(len(pos), size=batch)]
        pixels = torch.stack([r[0].sam_pixels for r in rows])
        boxes = torch.stack([r[1] for r in rows])[:, None, :]
        low = model.sam(pixel_values=pixels, input_boxes=boxes, multimask_output=False).pred_masks[:, 0, 0]
        bce, dice = [], []
        for i, (img, _, target) in enumerate(rows):
            logits = model.postprocess(low[i], img.resized, (int(target.shape[-2]), int(target.shape[-1])))
            bce.append(F.binary_cross_entropy_with_logits(logits, target))
            dice.append(dice_loss(logits, target))
        loss = BCE_WEIGHT * torch.stack(bce).mean() + DICE_WEIGHT * torch.stack(dice).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if max_seconds and time.perf_counter() - t0 > max_seconds:
            break
    model.eval()
    model.save_pretrained(out)
    return {"losses": losses, "seconds": time.perf_counter() - t0, "boxes": len(pos)}


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf) replaced by None, recursively through dicts,
    lists and tuples (tuples become lists): what ``json.dumps`` writes as standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
