"""``xflow train TRAINER``: fine-tune F_seg or train a policy (SFT, then GRPO).

Trainers and what ``--data`` / ``--model`` mean for each:

============  ===========================================  =========================================
trainer       ``--data``                                   ``--model`` / ``--init-from``
============  ===========================================  =========================================
segmenter     a dataset spec for ``datasets.read_dataset``  SAM3 tracker folder (or ``.pt``); no
              (``mimic-ils:JSON[:ROOT]``, ``folder:DIR``…,  ``--init-from``
              its ``--split``); every ground-truth
              component of a positive case is one sample
init-sft      ``xflow``-built ``init-sft`` set (or any      Gemma3 base folder / hub id;
              ``save_to_disk`` folder with those rows)      ``--init-from`` optional
rev-sft       ``rev-sft`` set                               base; ``--init-from`` π_init's SFT output
init-rl       ``init-rl`` set                               base; ``--init-from`` π_init's SFT output
rev-rl        ``rev-rl`` set; needs ``--segmenter``         base; ``--init-from`` π_rev's SFT output
============  ===========================================  =========================================

Hyperparameters are the paper's Table 7 (``configs/train/*.yaml`` spell them out); ``--config``
reads a YAML file over them and ``--max-steps`` caps the run. The output folder receives the
model (a peft adapter folder for the policies, a ``save_pretrained`` SAM3 folder for F_seg) and
``xflow_training.json``; a one-line JSON summary is printed on stdout.

Multi-process runs use accelerate with the same arguments::

    accelerate launch --config_file configs/accelerate/cpu.yaml -m monailabel_xflow.cli \\
        train init-sft --data built/init-sft --model BASE --out runs/init-sft

(``gpu1.yaml`` for one GPU, ``gpu8-fsdp.yaml`` for the paper's eight.)

Exit status 2 with the reason on stderr for bad input (unknown config key, missing columns or
folders, a rev-rl run without a segmenter); 1 for anything else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from monailabel_xflow.commands import int_in

TRAINERS = ("segmenter", "init-sft", "rev-sft", "init-rl", "rev-rl")
RECIPES = ("demo", "rosalia", "rosalia-demo")
HELP = {
    "segmenter": "fine-tune F_seg (SAM3's prompt encoder + mask decoder) on a dataset spec",
    "init-sft": "SFT of π_init on a built init-sft set",
    "rev-sft": "SFT of π_rev on a built rev-sft set",
    "init-rl": "GRPO of π_init (Eq. 4.5 rewards)",
    "rev-rl": "GRPO of π_rev with F_seg in the loop (Eq. 4.7 rewards)",
    "demo": "the demo XFlow on phantoms: F_seg, π_init, π_rev (monailabel_xflow.training.demo)",
    "rosalia": "ROSALIA, the papers' baseline, with its paper's recipe (monailabel_xflow.rosalia.training)",
    "rosalia-demo": "the ROSALIA demo on the XFlow demo's phantoms (monailabel_xflow.rosalia.demo)",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="fine-tune the segmenter or train a policy (SFT / GRPO), the demo or ROSALIA",
        description="Train one XFlow component: segmenter (F_seg fine-tuning), init-sft / rev-sft "
        "(SFT of π_init / π_rev), init-rl / rev-rl (GRPO); defaults are the paper's Table 7. These five "
        "take --data, --model, --out, --init-from, --config, --max-steps (xflow train TRAINER --help). "
        "Or run a recipe: demo, rosalia, rosalia-demo.",
        epilog="Under accelerate: accelerate launch --config_file configs/accelerate/cpu.yaml "
        "-m monailabel_xflow.cli train ...",
    )
    trainers = parser.add_subparsers(dest="trainer", metavar="TRAINER", required=True)
    common = model_options()
    for name in TRAINERS:
        trainers.add_parser(name, parents=[common], help=HELP[name], description=HELP[name]).set_defaults(func=run)
    add_demo_parser(trainers)
    add_rosalia_parser(trainers)
    add_rosalia_demo_parser(trainers)


def model_options() -> argparse.ArgumentParser:
    """The options of the five model trainers (a parent parser)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--data",
        required=True,
        help="segmenter: dataset spec (e.g. folder:DIR, mimic-ils:JSON:ROOT); policies: the built training set folder",
    )
    parser.add_argument("--model", required=True, help="base model folder or hub id (SAM3 for segmenter)")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="adapter to start from (rev-sft: π_init's SFT; RL: the same policy's SFT)",
    )
    parser.add_argument("--config", type=Path, default=None, help="YAML overriding the Table 7 defaults")
    parser.add_argument("--max-steps", type=int_in(1), default=None, help="cap the number of optimiser steps")
    parser.add_argument("--split", default="train", help="segmenter: dataset split to read (default train)")
    parser.add_argument("--segmenter", default=None, help="rev-rl: F_seg weights (folder or .pt) in the loop")
    parser.add_argument(
        "--per-device-batch",
        type=int,
        default=None,
        help="examples (SFT) or completions (RL) per device and step; the rest is "
        "gradient accumulation up to the config's effective batch",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=None, help="RL: tokens per completion (init-rl) or per turn (rev-rl)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def add_demo_parser(trainers: argparse._SubParsersAction) -> None:
    """``xflow train demo``: the recipe's own options (``training.demo.build_parser``, owned with
    the recipe), run by ``training.demo.run``."""
    from monailabel_xflow.training import demo

    recipe = demo.build_parser()
    sub = trainers.add_parser(
        "demo", parents=[recipe], add_help=False, help=HELP["demo"], description=recipe.description
    )
    sub.set_defaults(func=demo.run)


def add_rosalia_parser(trainers: argparse._SubParsersAction) -> None:
    """``xflow train rosalia``: every field of ``RosaliaTrainConfig`` is a flag."""
    import dataclasses

    from monailabel_xflow.rosalia.configs import RosaliaTrainConfig

    parser = trainers.add_parser(
        "rosalia",
        help=HELP["rosalia"],
        description="Train ROSALIA (LLaVA + SAM + [SEG]) with the paper's recipe on a dataset spec.",
    )
    parser.add_argument("--model", required=True, help="starting ROSALIA folder (see rosalia.configs / checkpoint)")
    parser.add_argument(
        "--data", required=True, help="dataset spec, e.g. mimic-ils:PHANTOMS/ground-truth/mimic_ils.json"
    )
    parser.add_argument("--split", action="append", default=None, help="split(s) to train on (default train)")
    parser.add_argument("--out", required=True, type=Path)
    defaults = RosaliaTrainConfig()
    for f in dataclasses.fields(RosaliaTrainConfig):
        if f.name in ("betas",):
            continue
        value = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value)
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=run_rosalia)


def run_rosalia(args: argparse.Namespace) -> int:
    """Train ROSALIA; prints a one-line JSON summary. Exit 2 for a bad dataset spec or model folder."""
    import dataclasses

    from monailabel_xflow.rosalia.configs import RosaliaTrainConfig
    from monailabel_xflow.rosalia.training import examples_from_spec, train_rosalia

    try:
        cfg = RosaliaTrainConfig(
            **{f.name: getattr(args, f.name) for f in dataclasses.fields(RosaliaTrainConfig) if f.name != "betas"}
        )
        examples = examples_from_spec(args.data, args.split or ["train"])
        log = train_rosalia(args.model, examples, args.out, cfg, progress=not args.no_progress)
    except (ValueError, FileNotFoundError) as err:
        print(f"xflow train rosalia: {err}", file=sys.stderr)
        return 2
    losses = log["losses"]
    summary = {
        "out": str(args.out),
        "steps": len(losses),
        "first_loss": losses[0]["loss"],
        "last_loss": losses[-1]["loss"],
        "seconds": round(log["seconds"], 1),
    }
    print(json.dumps(summary))
    return 0


def add_rosalia_demo_parser(trainers: argparse._SubParsersAction) -> None:
    """``xflow train rosalia-demo``: every field of ``RosaliaDemoRecipe`` is a flag."""
    import dataclasses

    from monailabel_xflow.rosalia.demo import RosaliaDemoRecipe

    parser = trainers.add_parser(
        "rosalia-demo",
        help=HELP["rosalia-demo"],
        description="Train the ROSALIA demo model on the XFlow demo's phantoms.",
    )
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--install", action="store_true", help="copy the result to monailabel_xflow/rosalia/demo/")
    parser.add_argument("--quick", action="store_true", help="toy scale: checks the recipe runs, learns nothing")
    defaults = RosaliaDemoRecipe()
    for f in dataclasses.fields(RosaliaDemoRecipe):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(defaults, f.name)), default=None)
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=run_rosalia_demo)


def run_rosalia_demo(args: argparse.Namespace) -> int:
    """Train (and with ``--install`` install) the ROSALIA demo; prints its held-out metrics as JSON."""
    import dataclasses
    import logging

    from monailabel_xflow.rosalia.demo import QUICK, RosaliaDemoRecipe, install, train_rosalia_demo

    base = QUICK if args.quick else RosaliaDemoRecipe()
    changes = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(RosaliaDemoRecipe)
        if getattr(args, f.name) is not None
    }
    try:
        recipe = dataclasses.replace(base, **changes)
    except ValueError as err:
        print(f"xflow train rosalia-demo: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)
    model_dir = train_rosalia_demo(args.out, recipe, progress=not args.no_progress)
    if args.install:
        logging.getLogger(__name__).info("installed the ROSALIA demo in %s", install(model_dir))
    heldout = json.loads((model_dir / "recipe.json").read_text())["heldout"]
    print(json.dumps({"model": str(model_dir), **heldout}, default=str)[:2000])
    return 0


def run(args: argparse.Namespace) -> int:
    from monailabel_xflow.training.config import ConfigError, load_config

    try:
        cfg = load_config(args.trainer, args.config, max_steps=args.max_steps)
        _check_paths(args)
        summary = _train(args, cfg)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"xflow train {args.trainer}: {exc}", file=sys.stderr)
        return 2
    keep = {k: v for k, v in summary.items() if k not in ("losses", "reward", "rewards_per_term", "aux_mask_loss")}
    losses = summary.get("losses") or []
    keep.update(out=str(args.out), first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None)
    print(json.dumps(keep, default=str))
    return 0


def _check_paths(args: argparse.Namespace) -> None:
    if args.init_from is not None and not args.init_from.exists():
        raise FileNotFoundError(f"--init-from {args.init_from} does not exist")
    if args.trainer != "segmenter" and not Path(args.data).exists():
        raise FileNotFoundError(f"--data {args.data} does not exist")
    if args.trainer == "rev-rl" and not args.segmenter:
        raise ValueError("rev-rl runs F_seg in the loop: give --segmenter")
    if args.trainer == "segmenter" and args.init_from is not None:
        raise ValueError("segmenter takes no --init-from (start from --model)")


def _train(args: argparse.Namespace, cfg) -> dict:
    progress = not args.no_progress
    if args.trainer == "segmenter":
        from monailabel_xflow.data.readers import read_dataset
        from monailabel_xflow.training.segmenter import finetune_segmenter, samples_from_cases

        read = read_dataset(args.data, split=args.split)
        samples = samples_from_cases(read.cases, progress=progress)
        if not samples:
            raise ValueError(f"{args.data}: no positive case with a mask to train on ({len(read.cases)} cases read)")
        out = finetune_segmenter(args.model, samples, args.out, cfg, progress=progress)
        summary = {"trainer": "segmenter", "cases": len(read.cases), "samples": len(samples), **out}
        Path(args.out, "xflow_training.json").write_text(json.dumps(summary, indent=2, default=str))
        return summary
    if args.trainer.endswith("-sft"):
        from monailabel_xflow.training.sft import train_sft

        return train_sft(
            args.trainer,
            args.data,
            args.model,
            args.out,
            cfg,
            init_from=args.init_from,
            per_device_batch=args.per_device_batch,
            progress=progress,
        )
    from monailabel_xflow.training.grpo import train_grpo

    return train_grpo(
        args.trainer,
        args.data,
        args.model,
        args.out,
        args.init_from,
        cfg,
        segmenter=args.segmenter,
        max_new_tokens=args.max_new_tokens,
        per_device_batch=args.per_device_batch,
        progress=progress,
    )
