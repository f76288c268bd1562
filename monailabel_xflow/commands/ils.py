"""``xflow ils build``: instruction-segmentation data from radiographs and reports (MIMIC-ILS).

Usage::

    xflow ils build --images DIR --reports CSV --out OUT [--stages YAML] [--high-recall]
                    [--workers N | --dask ADDRESS | --dask local:N] [--shard i/N] [--split SPLIT]
                    [--structurer rules | --structurer llm --llm-model PATH]
                    [--section findings | --section findings+impression]
    xflow ils recall --images PHANTOM_SET --out DIR [--reports CSV | phantom-truth]

``--images`` is the folder the CSV's image paths are relative to; a set written by ``xflow
phantom`` runs with the phantom stand-in stages without ``--stages``. ``--reports`` is a CSV with
``study_id``, ``image_path`` (or ``image``) and ``report`` columns (optional ``split``,
``subject_id``; ``xflow phantom`` writes one as ``reports.csv``); each report's findings section
(else impression, else last paragraph) is structured by :mod:`monailabel_xflow.ils.report`
(medspaCy rules, or ``--structurer llm --llm-model PATH``); ``--section findings+impression``
structures findings and impression together instead (more recall: findings stated only in the
impression are kept). ``--reports phantom-truth`` instead
takes the findings a perfect structurer would give from a phantom set's ground truth (measures
the image side alone).

Resumable (finished studies are kept in ``OUT/work/studies``; run the same command again) and
sharded (``--shard i/N`` on N machines, then any run merges what is finished). Output layout:
:mod:`monailabel_xflow.ils.pipeline`. Exit status 0 on success, 2 for bad input or an
unconfigured stage.
"""

from __future__ import annotations

import sys
from pathlib import Path

from monailabel_xflow.commands import int_in, not_a_folder


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "ils",
        help="build MIMIC-ILS instruction-segmentation data from radiographs and reports",
        description="The MIMIC-ILS pipeline: structure reports, run the vision stages (anatomy, healthy "
        "counterfactual, locations, lesion boxes), make lesion masks by Algorithm 1 and write MIMIC-ILS JSON, "
        "PNG masks and review sheets.",
    )
    sub = p.add_subparsers(dest="ils_command", metavar="ACTION", required=True)
    b = sub.add_parser(
        "build",
        help="run the pipeline (resumable, sharded, processes or Dask)",
        description=__doc__.split("\n\n", 2)[2],
        formatter_class=_raw(),
    )
    b.add_argument(
        "--images", required=True, type=Path, metavar="DIR", help="folder the reports' image paths are relative to"
    )
    b.add_argument(
        "--reports", required=True, metavar="CSV", help="reports CSV (study_id,image_path,report) or 'phantom-truth'"
    )
    b.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder (resumes if it holds work/)")
    b.add_argument("--stages", metavar="YAML", help="stage configuration (keys anatomy, healthy, locations, detector)")
    b.add_argument(
        "--high-recall", action="store_true", help="halve every threshold of Algorithm 1 (the paper's variant)"
    )
    b.add_argument("--workers", type=int_in(1, 256), default=1, help="local processes (default 1)")
    b.add_argument(
        "--dask", metavar="ADDRESS", help="run on a Dask scheduler (tcp://host:8786), or 'local:N' for N local workers"
    )
    b.add_argument("--shard", default="0/1", help="i/N: process every N-th study from the i-th")
    b.add_argument("--split", default="train", help="split of studies whose row names none (default train)")
    _structurer_args(b)
    b.set_defaults(func=run_build)
    r = sub.add_parser(
        "recall",
        help="pipeline recall (Table 8 layout) and mask IoU on a phantom set",
        description="Run the pipeline on an `xflow phantom` set with default and halved thresholds, "
        "with findings from its structured reports.csv and from its truth, and write report structuring "
        "precision/recall per field, recall per finding (the paper's Table 8 layout) and mask IoU against "
        "the phantom truth (OUT/recall.md, OUT/recall.json).",
    )
    r.add_argument("--images", required=True, type=Path, metavar="DIR", help="a set written by xflow phantom")
    r.add_argument(
        "--reports",
        metavar="CSV",
        help="reports CSV to structure (default: the set's reports.csv, whose structuring is also scored "
        "against ground-truth/report_findings.json); 'phantom-truth': only the truth findings",
    )
    r.add_argument("--out", required=True, type=Path, metavar="DIR", help="where recall.md / recall.json go")
    r.add_argument("--work", type=Path, metavar="DIR", help="pipeline outputs (default OUT/work)")
    r.add_argument("--workers", type=int_in(1, 256), default=1)
    _structurer_args(r)
    r.set_defaults(func=run_recall, split="train")


def _structurer_args(p) -> None:
    p.add_argument(
        "--structurer",
        choices=("rules", "llm"),
        default="rules",
        help="report structurer: medspaCy rules (default) or a local instruction-tuned LLM (--llm-model)",
    )
    p.add_argument(
        "--llm-model",
        metavar="PATH",
        help="with --structurer llm: a local Hugging Face model folder (never downloaded)",
    )
    p.add_argument(
        "--llm-max-new-tokens",
        type=int_in(1, 32768),
        default=512,
        metavar="N",
        help="with --structurer llm: longest answer per report (default 512)",
    )
    p.add_argument(
        "--section",
        choices=("findings", "findings+impression"),
        default="findings",
        help="what is structured: 'findings' (default, the papers' rule: findings, else impression, "
        "else last paragraph) or 'findings+impression' (both together: more recall)",
    )


def _raw():
    import argparse

    return argparse.RawDescriptionHelpFormatter


def _structurer(args):
    try:
        from monailabel_xflow.ils import report_llm
    except ImportError as err:
        raise ValueError(f"the report structurer (monailabel_xflow.ils.report_llm) is not available: {err}") from err
    if args.structurer == "llm":
        if not args.llm_model:
            raise ValueError("--structurer llm needs --llm-model PATH (a local model folder)")
        return report_llm.structurer_from_name("llm", model=args.llm_model, max_new_tokens=args.llm_max_new_tokens)
    return report_llm.structurer_from_name("rules")


def _inputs(args, structure=None):
    from monailabel_xflow.ils.pipeline import read_reports

    if args.reports == "phantom-truth":
        from monailabel_xflow.ils.phantom_truth import truth_inputs

        return truth_inputs(args.images), []
    from functools import partial

    from monailabel_xflow.ils.report import choose_section

    choose = partial(choose_section, rule=getattr(args, "section", "findings"))
    return read_reports(args.reports, args.images, structure or _structurer(args), choose, args.split)


def run_build(args) -> int:
    from tqdm import tqdm

    from monailabel_xflow.ils import masks
    from monailabel_xflow.ils.pipeline import PipelineConfig, PipelineError, run
    from monailabel_xflow.ils.stages import StageError, load_stages

    try:
        i, n = (int(v) for v in args.shard.split("/"))
    except ValueError:
        print(f"xflow ils build: --shard must look like 0/4, got {args.shard!r}", file=sys.stderr)
        return 2
    if not args.images.is_dir():
        print(f"xflow ils build: --images {args.images} is not a folder", file=sys.stderr)
        return 2
    if problem := not_a_folder(args.out):
        print(f"xflow ils build: --out {problem}", file=sys.stderr)
        return 2
    local_workers = None
    if args.dask and args.dask.startswith("local:"):
        count = args.dask.split(":", 1)[1]
        if not (count.isdigit() and 1 <= int(count) <= 256):  # 0 hung until killed
            print(f"xflow ils build: --dask local:N needs N in 1..256, got {count!r}", file=sys.stderr)
            return 2
        local_workers = int(count)
    try:
        load_stages(args.stages, args.images)  # an unconfigured stage fails before any report is read
    except StageError as err:
        print(f"xflow ils build: {err}", file=sys.stderr)
        return 2
    try:
        studies, skipped = _inputs(args)
    except (PipelineError, OSError, KeyError, ValueError) as err:
        print(f"xflow ils build: cannot read the reports: {err}", file=sys.stderr)
        return 2
    for line in skipped[:20]:
        print(f"xflow ils build: skipped: {line}", file=sys.stderr)
    if not studies:
        print("xflow ils build: no study to process", file=sys.stderr)
        return 2
    thresholds = masks.HIGH_RECALL_THRESHOLDS if args.high_recall else masks.DEFAULT_THRESHOLDS
    config = PipelineConfig(args.out.resolve(), args.stages, args.images.resolve(), thresholds)
    cluster = scheduler = None
    try:
        if local_workers is not None:
            from distributed import LocalCluster

            cluster = LocalCluster(
                n_workers=local_workers, threads_per_worker=1, processes=True, dashboard_address=None
            )
            scheduler = cluster.scheduler_address
        elif args.dask:
            scheduler = args.dask
        summary = run(
            studies,
            config,
            shard=(i, n),
            workers=args.workers,
            scheduler=scheduler,
            progress=lambda it: tqdm(it, desc="studies", unit="study", total=None),
        )
    except (PipelineError, StageError) as err:
        print(f"xflow ils build: {err}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError) as err:  # a Dask scheduler that does not answer
        print(f"xflow ils build: cannot reach the Dask scheduler {args.dask}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("xflow ils build: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        if cluster is not None:
            cluster.close()
    for study, error in list(summary["failed"].items())[:20]:
        print(f"xflow ils build: study {study} not written: {error}", file=sys.stderr)
    rec = summary["recall"]["mean"]
    recall = "n/a" if rec["recall"] is None else f"{rec['recall']:.1%}"
    print(
        f"{summary['written']}/{summary['studies']} studies written ({summary['qc_dropped']} dropped by QC, "
        f"{summary['errors']} unreadable); {summary['positive_pairs']} positive and {summary['negative_pairs']} "
        f"negative pairs; masks for {rec['generated']}/{rec['reported']} reported lung findings (mean recall {recall})"
    )
    print(f"MIMIC-ILS JSON: {args.out / 'ground-truth' / 'mimic_ils.json'}; review sheets in {args.out / 'review'}")
    return 1 if summary["errors"] and not summary["written"] else 0


def run_recall(args) -> int:
    import json
    import shlex

    from tqdm import tqdm

    from monailabel_xflow.data.export import GT_DIR, REPORTS_CSV
    from monailabel_xflow.data.mimic_ils import TRUTH_NAME
    from monailabel_xflow.ils.phantom_truth import recall_report, truth_inputs
    from monailabel_xflow.ils.pipeline import PipelineError
    from monailabel_xflow.ils.report_eval import evaluate_phantoms
    from monailabel_xflow.ils.stages import PhantomSet

    if not PhantomSet.is_phantom_set(args.images):
        print(f"xflow ils recall: {args.images} is not a phantom set (no ground-truth/phantoms.json)", file=sys.stderr)
        return 2
    own_csv = args.images / REPORTS_CSV
    if args.reports is None:
        args.reports = str(own_csv) if own_csv.is_file() else "phantom-truth"
    sources, structuring = {}, None
    progress = lambda it: tqdm(it, desc="studies", unit="study")  # noqa: E731
    try:
        if args.reports != "phantom-truth":
            structure = _structurer(args)
            sources["reports"], skipped = _inputs(args, structure)
            for line in skipped[:20]:
                print(f"xflow ils recall: skipped: {line}", file=sys.stderr)
            if not sources["reports"]:
                print("xflow ils recall: no study to process", file=sys.stderr)
                return 2
            if Path(args.reports).resolve() == own_csv.resolve() and (args.images / GT_DIR / TRUTH_NAME).is_file():
                structuring = evaluate_phantoms(args.images, structure)
        sources["truth"] = truth_inputs(args.images)
    except (PipelineError, OSError, KeyError, ValueError) as err:
        print(f"xflow ils recall: cannot read the reports: {err}", file=sys.stderr)
        return 2
    how = "xflow " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["ils"] else ""
    figures, text = recall_report(
        args.images,
        args.work or args.out / "work",
        sources,
        args.workers,
        progress=progress,
        structuring=structuring,
        how=how,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "recall.json").write_text(json.dumps(figures, indent=1))
    (args.out / "recall.md").write_text(text)
    print(text)
    return 0
