"""``xflow segment``: answer instructions about one radiograph and write the mask and its trace.

Usage::

    xflow segment IMAGE (--instruction TEXT | --all-findings) --out DIR
                  [--models CONFIG] [--max-clicks N] [--no-revise] [-q]

``IMAGE`` is a PNG, JPEG or DICOM (anything ``transforms.load_cxr`` reads). ``--instruction``
is free text ("Segment the effusion in the left lung.", "is there fluid on the left?"); text
naming several findings, or ``--all-findings`` (the seven at chest level), gives one answer each.
Models come from ``--models`` (YAML/JSON, see :mod:`monailabel_xflow.workflow.model_config`), else from the
``XFLOW_*`` environment variables; nothing is downloaded.

Output, for one instruction in ``DIR`` itself, for several in ``DIR/NN_<finding>[_<regions>]/``:

* ``mask.png`` (8-bit, 0/255, the image's size) and ``mask.nii.gz`` (``save_nifti_2d``, the
  image's pixel spacing when the file has one);
* ``trace.json`` (schema ``xflow-trace/1``, :mod:`monailabel_xflow.workflow.trace`);
* ``overlays/<NN>_<step>.png`` (one picture per decision) and ``contact_sheet.png``;

and ``DIR/summary.json`` (one entry per instruction: instruction, present, answer, folder).
The answer sentence(s) go to stdout; progress and timings to stderr. Exit status 0 on success,
2 for an unreadable image, an instruction that cannot be mapped or a model configuration that
is incomplete or names weights not available locally.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

from monailabel_xflow.commands.weights import MODELS_HELP
from monailabel_xflow.policy.base import MAX_CLICKS_LIMIT, BudgetError, check_budget

logger = logging.getLogger("xflow.segment")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "segment",
        help="segment findings in a chest radiograph and write mask, trace and overlays",
        description=(
            "Answer instructions about one chest radiograph. Writes mask.png (0/255), mask.nii.gz, "
            "trace.json, overlays/ and contact_sheet.png into --out (one sub-folder per instruction "
            "when there are several) and summary.json; prints the answers."
        ),
        epilog=(
            "Models: --models FILE (YAML/JSON: vlm_base, init_adapter, rev_adapter or init_model, "
            "rev_model; segmenter; device; dtype), else the XFLOW_* environment variables; nothing "
            "is downloaded (see `xflow weights`). Exit status: 0 ok, 2 unreadable image, unmappable "
            "instruction or unusable model configuration, 1 other failures."
        ),
    )
    parser.add_argument("image", type=Path, help="PNG, JPEG or DICOM chest radiograph (frontal view)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--instruction", "-i", help='free text, e.g. "Segment the effusion in the left lung."')
    what.add_argument("--all-findings", action="store_true", help="the seven findings at chest level")
    parser.add_argument("--out", "-o", type=Path, required=True, help="output folder (created)")
    parser.add_argument("--models", "-m", help=MODELS_HELP)
    parser.add_argument(
        "--max-clicks",
        type=int,
        default=None,
        help=f"Stage 2 click budget T, 0..{MAX_CLICKS_LIMIT} (default from the config, 4)",
    )
    parser.add_argument("--no-revise", action="store_true", help="skip Stage 2 (Stage 1 masks only)")
    parser.add_argument("--quiet", "-q", action="store_true", help="warnings only on stderr")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _setup_logging(args.quiet)
    from monailabel_xflow.instructions import InstructionError, all_findings, parse_instructions
    from monailabel_xflow.transforms import CXRLoadError, load_cxr
    from monailabel_xflow.workflow.model_config import ModelConfigError

    if args.max_clicks is not None:
        try:
            check_budget(args.max_clicks)
        except BudgetError as err:
            return _bad_input(f"--max-clicks: {err}")
    try:
        instructions = all_findings() if args.all_findings else parse_instructions(args.instruction)
    except InstructionError as err:
        return _bad_input(f"instruction: {err}")
    try:
        image, meta = load_cxr(args.image)
    except CXRLoadError as err:
        return _bad_input(f"cannot load {args.image}: {err}")
    if args.out.exists() and not args.out.is_dir():
        return _bad_input(f"--out {args.out} exists and is not a folder")
    logger.info("loaded %s: %d x %d (%s)", args.image, image.shape[0], image.shape[1], meta.get("format"))

    from monailabel_xflow.workflow.xflow import XFlow

    try:
        flow = XFlow.from_config(args.models)
    except ModelConfigError as err:
        return _bad_input(f"models: {err}")
    revise = not args.no_revise
    if len(instructions) == 1:
        results = [flow.run(image, instructions[0], max_clicks=args.max_clicks, revise=revise)]
    else:
        results = flow.run_all(image, max_clicks=args.max_clicks, revise=revise, instructions=instructions)

    args.out.mkdir(parents=True, exist_ok=True)
    summary = []
    for k, result in enumerate(results):
        folder = args.out if len(results) == 1 else args.out / _slug(k, result.instruction)
        write_result(result, image, folder, spacing=meta.get("spacing"))
        summary.append(
            {
                "instruction": result.instruction.text,
                "present": result.present,
                "answer": result.answer,
                "message": result.message,
                "folder": str(folder.relative_to(args.out)) if folder != args.out else ".",
            }
        )
        timings = ", ".join(f"{key} {value:.2f} s" for key, value in result.trace.timings.items())
        logger.info("%s: %s", result.instruction.text, timings)
        print(result.message if len(results) == 1 else f"{result.instruction.text} {result.message}")
    (args.out / "summary.json").write_text(json.dumps({"image": str(args.image), "results": summary}, indent=1))
    logger.info("wrote %s", args.out)
    return 0


def write_result(result, image, folder: Path, spacing=None) -> None:
    """Write one result's mask (PNG, NIfTI), trace JSON, step overlays and contact sheet."""
    import numpy as np
    from PIL import Image

    from monailabel_xflow.transforms import save_nifti_2d
    from monailabel_xflow.workflow.trace import render_contact_sheet, render_trace

    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(result.mask.astype(np.uint8) * 255, mode="L").save(folder / "mask.png")
    save_nifti_2d(result.mask, folder / "mask.nii.gz", spacing=spacing)
    (folder / "trace.json").write_text(result.trace.to_json())
    overlays = folder / "overlays"
    overlays.mkdir(exist_ok=True)
    for n, (name, rgb) in enumerate(render_trace(result.trace, image)):
        Image.fromarray(rgb).save(overlays / f"{n:02d}_{name}.png")
    Image.fromarray(render_contact_sheet(result.trace, image)).save(folder / "contact_sheet.png")


def _slug(k: int, instruction) -> str:
    parts = [instruction.finding, *instruction.regions]
    return f"{k + 1:02d}_" + "_".join(re.sub(r"[^a-z0-9]+", "-", p.lower()).strip("-") for p in parts)


def _bad_input(message: str) -> int:
    print(f"xflow segment: error: {message}", file=sys.stderr)
    return 2


def _setup_logging(quiet: bool) -> None:
    level = logging.WARNING if quiet else logging.INFO
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("xflow", "monailabel_xflow"):
        logging.getLogger(name).setLevel(level)
    if quiet:  # transformers' weight-loading bars and notices are not warnings for the user
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
