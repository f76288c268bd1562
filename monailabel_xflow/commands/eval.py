"""``xflow eval``: score saved predictions or a model on an evaluation set (paper Tables 1, 3)."""

from __future__ import annotations

import sys
from pathlib import Path

from monailabel_xflow.commands import int_in, not_a_folder
from monailabel_xflow.eval.evaluate import model_identity


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate predictions or a model on MIMIC-ILS / CheXlocalize / a folder (gIoU, cIoU, F1, noise)",
        description="Score instruction-guided segmentations per question level (chest/lung/zone, "
        "averaged with equal weight) and per finding: gIoU, cIoU, presence F1, N-Acc, ROSALIA's "
        "all-samples gIoU, and mask noise (components, specks). Writes results.jsonl (one line "
        "per case; a rerun with the same --out resumes, redoing cases another model or other "
        "predictions produced), report.json, report.md and PNG plots. "
        "Dataset specs: 'mimic-ils:JSON[:ROOT]' (ROOT = MIMIC-CXR-JPG root; masks from "
        "lesion_mask/ beside the JSON), 'chexlocalize:JSON:IMAGE_ROOT' (COCO-RLE radiologist "
        "masks, six shared findings, chest level), 'folder:DIR' (DIR/instructions.csv with "
        "columns image,mask,instruction; empty mask = negative). Exit status 1 when some cases "
        "could not be scored (e.g. a missing prediction; they are listed in the report).",
    )
    p.add_argument(
        "--dataset",
        required=True,
        metavar="SPEC",
        help="mimic-ils:JSON[:ROOT] | chexlocalize:JSON:IMAGE_ROOT | folder:DIR",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--predictions", type=Path, metavar="DIR", help="saved masks DIR/<case_id>.png (non-zero = lesion)"
    )
    src.add_argument("--model", metavar="CONFIG", help="run XFlow from this model config (YAML/JSON)")
    p.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="output folder (resumes if it holds results.jsonl)"
    )
    p.add_argument("--split", default="test", help="MIMIC-ILS split (default test)")
    p.add_argument("--lesion-inference", action="store_true", help="MIMIC-ILS: also score lesion-inference questions")
    p.add_argument("--strict", action="store_true", help="stop (exit 2) if the dataset has any problem")
    p.add_argument("--connectivity", type=int, choices=(4, 8), default=8, help="component connectivity (default 8)")
    p.add_argument("--no-resume", action="store_true", help="discard results.jsonl in --out and start afresh")
    p.add_argument("--limit", type=int_in(1), default=None, help="score only the first N cases")
    p.add_argument("--save-predictions", action="store_true", help="with --model: write out/predictions/<case_id>.png")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.set_defaults(func=run)


def _model_predictor(config: str):
    """``predict(case)`` running XFlow; raises ImportError when the workflow is not available."""
    from monailabel_xflow.workflow.xflow import XFlow  # noqa: F401  (import error = no workflow)

    model = XFlow.from_config(config)
    from monailabel_xflow.transforms.loading import load_cxr

    def predict(case):
        image, _ = load_cxr(case.image_path)
        return model.run(image, case.instruction).mask

    return predict


def run(args) -> int:
    from monailabel_xflow.data.readers import DatasetError, read_dataset
    from monailabel_xflow.eval.evaluate import evaluate, files_fingerprint, predictions_from_dir

    if problem := not_a_folder(args.out):
        print(f"xflow eval: --out {problem}", file=sys.stderr)
        return 2
    kinds = ("basic", "global", "lesion_inference") if args.lesion_inference else ("basic", "global")
    try:
        result = read_dataset(args.dataset, split=args.split, strict=args.strict, kinds=kinds)
    except DatasetError as err:
        print(f"xflow eval: {err}", file=sys.stderr)
        return 2
    if result.problems:
        listed = " (listed in report.md)" if result.cases else ""
        print(f"xflow eval: {len(result.problems)} dataset entries left out{listed}; first:", file=sys.stderr)
        for line in result.problems[:5]:
            print(f"  {line}", file=sys.stderr)
    for reason, count in sorted(result.skipped.items()):
        print(f"xflow eval: left out on purpose: {count} ({reason})", file=sys.stderr)
    cases = result.cases[: args.limit] if args.limit is not None else result.cases
    if not cases:
        print(f"xflow eval: no usable cases in {args.dataset}", file=sys.stderr)
        return 2
    if args.predictions is not None:
        if not args.predictions.is_dir():
            print(f"xflow eval: --predictions {args.predictions} is not a folder", file=sys.stderr)
            return 2
        predict = predictions_from_dir(args.predictions)
        identity = files_fingerprint(args.predictions)
    else:
        try:
            predict = _model_predictor(args.model)
        except ImportError as err:
            print(
                f"xflow eval: --model needs monailabel_xflow.workflow.xflow (XFlow.from_config), which is not "
                f"available here ({err}); save masks and use --predictions DIR instead",
                file=sys.stderr,
            )
            return 2
        except (ValueError, OSError) as err:
            print(f"xflow eval: cannot load the model from {args.model}: {err}", file=sys.stderr)
            return 2
        identity = model_identity(args.model)
    report = evaluate(
        cases,
        predict,
        args.out,
        connectivity=args.connectivity,
        resume=not args.no_resume,
        predictor_id=identity,
        save_predictions=args.save_predictions and args.model is not None,
        problems=result.problems,
        title=f"XFlow evaluation: {args.dataset}",
        plots=not args.no_plots,
    )
    avg = report["average"]
    fmt = lambda v: "—" if v is None or v != v else f"{v:.3f}"  # noqa: E731
    print(
        f"{report['n_scored']}/{len(cases)} cases scored; equal-weight level average: "
        f"gIoU {fmt(avg['giou'])}, cIoU {fmt(avg['ciou'])}, F1 {fmt(avg['f1'])}, N-Acc {fmt(avg['n_acc'])}"
    )
    print(f"reports in {args.out} (report.md, report.json, results.jsonl)")
    if report["notes"]:  # e.g. a GT mask of another aspect ratio, a positive with an empty mask
        print(f"xflow eval: {len(report['notes'])} note(s) in report.md, e.g. {report['notes'][0]}", file=sys.stderr)
    if report["errors"]:
        print(
            f"xflow eval: {len(report['errors'])} case(s) could not be scored, e.g. "
            f"{next(iter(report['errors'].items()))}",
            file=sys.stderr,
        )
        return 1
    return 0
