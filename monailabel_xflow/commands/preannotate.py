"""``xflow preannotate``: run XFlow over the CR/DX studies of a PACS and store each answer as a DICOM SEG.

Usage::

    xflow preannotate --studies http://HOST:PORT/dicom-web [--finding F ...] [--location L]
                      [--models CONFIG] [--workspace DIR] [--limit N] [--cache DIR] [--no-revise]
                      [--max-clicks N]
                      [--store WORKSPACE/store [--store-mb MB]]

For every CR/DX series the DICOMweb datastore lists (the same series filter as ``xflow serve``),
XFlow answers the chosen findings (default: all seven, chest level) and the label map goes back
into the image's study as one SEG (:mod:`monailabel_xflow.data.seg`: one segment per finding
asked, empty when absent), marked ``ContentLabel XFLOW_AUTO`` so that OHIF shows it and the
datastore does not mistake it for a reviewed label.

The **workspace** is ``xflow serve``'s (``--workspace DIR``, else ``$XFLOW_WORKSPACE``, else
``~/.local/share/monailabel-xflow/workspace``): the series are downloaded into its
``cache/dicomweb`` (unless ``--cache`` or MONAI Label's cache variables say otherwise), and a
segmenter fine-tuned by the server's train task in its ``model/`` is the one used, so a batch run
answers as the server would.

With ``--store`` the embeddings and answers it computes go into the server's workspace store
(:mod:`monailabel_xflow.segmenter.store`), with the Stage 1 only answers 3D Slicer's Next Sample
auto-runs, so the server answers those series at once.

**Resumable**: a series that already holds an ``XFLOW_AUTO`` SEG covering the findings asked is
skipped, so an interrupted run continues where it stopped; ``--force`` redoes them. A series
XFlow cannot read (a lateral view, a corrupt file) is reported and skipped; the others go on.
Progress goes to stderr (tqdm), one JSON summary to stdout (``done``, ``skipped``, ``failed``
with reasons, ``seconds``). A PACS that stops answering (no connection, timeout, HTTP 5xx) stops
the run at once with a message naming it (``stopped`` in the summary; the same command resumes
later without duplicate SEGs). Exit status 0 when nothing failed, 1 when some series failed, 2 for
bad arguments or an unusable model configuration, 3 when the PACS did not answer.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from monailabel_xflow.policy.base import MAX_CLICKS_LIMIT, BudgetError, check_budget

logger = logging.getLogger("xflow.preannotate")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "preannotate",
        help="run XFlow over the CR/DX studies of a DICOMweb PACS and store the answers as DICOM SEG",
        description="Batch pre-annotation: XFlow answers the chosen findings for every CR/DX series of "
        "the PACS and stores one DICOM SEG per series in its study (resumable: series already done are "
        "skipped). Prints a JSON summary.",
    )
    parser.add_argument("--studies", required=True, help="DICOMweb URL (http://host:port/dicom-web)")
    parser.add_argument(
        "--finding",
        "-f",
        action="append",
        default=[],
        help="a finding to look for (repeat; default: all seven findings)",
    )
    parser.add_argument(
        "--location", default="", help="a lung or zone to restrict the question to (the heart for cardiomegaly)"
    )
    parser.add_argument("--models", "-m", help="model configuration (YAML/JSON); default: XFLOW_* or the demo model")
    parser.add_argument(
        "--workspace",
        help="the server's workspace, as for xflow serve: its DICOMweb cache and fine-tuned segmenter (default "
        "$XFLOW_WORKSPACE, else ~/.local/share/monailabel-xflow/workspace)",
    )
    parser.add_argument("--limit", type=int, default=0, help="stop after N series (0 = all)")
    parser.add_argument("--cache", help="download cache folder (default: the workspace's cache/dicomweb)")
    parser.add_argument(
        "--max-clicks",
        type=int,
        default=None,
        help=f"Stage 2 click budget, 0..{MAX_CLICKS_LIMIT} (default: the models')",
    )
    parser.add_argument("--no-revise", action="store_true", help="Stage 1 masks only (faster)")
    parser.add_argument("--force", action="store_true", help="redo series that already hold XFlow's SEG")
    parser.add_argument(
        "--store",
        help="the server's workspace store to fill (WORKSPACE/store): embeddings and answers computed here are "
        "then served by `xflow serve` without computing them again (default: none)",
    )
    parser.add_argument("--store-mb", type=int, default=None, help="the store's bound in MB (default 8192)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from monailabel_xflow.instructions import InstructionError

    if not args.studies.startswith(("http://", "https://")):
        print(f"xflow preannotate: --studies must be a DICOMweb URL, got {args.studies!r}", file=sys.stderr)
        return 2
    if args.limit < 0:
        print("xflow preannotate: --limit must be >= 0", file=sys.stderr)
        return 2
    from monailabel_xflow.app import server_defaults
    from monailabel_xflow.app.datastore import make_dicomweb_datastore
    from monailabel_xflow.app.infer import XFlowInferTask
    from monailabel_xflow.commands.serve import WorkspaceError, default_workspace, prepare_workspace
    from monailabel_xflow.task_options import instructions_from_request
    from monailabel_xflow.workflow.runtime import XFlowRuntime

    request = {
        "finding": args.finding or ["all findings"],
        "location": args.location,
        "revise": not args.no_revise,
        "max_clicks": args.max_clicks,
        "trace": False,
    }
    if args.max_clicks is not None:
        try:
            check_budget(args.max_clicks)  # before any series is tried: one answer, not one per series
        except BudgetError as exc:
            print(f"xflow preannotate: --max-clicks: {exc}", file=sys.stderr)
            return 2
    try:
        findings = list(dict.fromkeys(i.finding for i in instructions_from_request(request)))
    except (InstructionError, ValueError) as exc:
        print(f"xflow preannotate: {exc}", file=sys.stderr)
        return 2
    try:
        workspace = prepare_workspace(args.workspace or default_workspace())
    except (WorkspaceError, OSError) as exc:
        print(f"xflow preannotate: {exc}", file=sys.stderr)
        return 2
    server_defaults.apply(workspace)  # the cache folder the server uses
    from monailabel_xflow.data.pacs import pacs_failure

    try:
        store = make_dicomweb_datastore(args.studies, cache_path=args.cache)
        done_before = store.preannotated()
        series = store.list_images()
    except Exception as exc:
        failure = pacs_failure(exc, args.studies)
        if failure is None:
            raise
        print(f"xflow preannotate: {failure}", file=sys.stderr)
        return 3
    todo = [s for s in series if args.force or not set(findings) <= done_before.get(s, set())]
    if args.limit:
        todo = todo[: args.limit]
    summary: dict = {
        "findings": findings,
        "series": len(series),
        "skipped": len(series) - len(todo),
        "done": [],
        "failed": {},
    }
    if args.store:
        from monailabel_xflow.segmenter.store import configure_from_conf

        try:
            configure_from_conf(args.store, {"store_dir": args.store, "store_mb": args.store_mb})
        except Exception as exc:  # RequestError (a bad --store-mb), OSError: say it, exit 2
            print(f"xflow preannotate: --store: {exc}", file=sys.stderr)
            return 2
    if todo:  # load the models only when there is work (a resumed, finished run returns at once)
        runtime = XFlowRuntime(
            {"models": args.models} if args.models else {}, preload=False, model_dir=workspace / "model"
        )
        try:
            runtime.get()
        except Exception as exc:  # ModelsNotConfiguredError / ModelConfigError: say it, exit 2
            print(f"xflow preannotate: {exc}", file=sys.stderr)
            return 2
        task = XFlowInferTask(runtime)
    t0 = time.perf_counter()
    for image_id in tqdm(todo, desc="pre-annotating", unit="series", file=sys.stderr):
        try:
            seg_series = preannotate_one(store, task, image_id, request, findings)
        except Exception as exc:  # one unreadable series must not stop the batch; a PACS that went away does
            failure = pacs_failure(exc, args.studies)
            if failure is not None:
                summary["stopped"] = f"{failure}; run the same command again to resume (stored series are skipped)"
                print(f"xflow preannotate: {summary['stopped']}", file=sys.stderr)
                break
            logger.warning("series %s: %s", image_id, exc)
            summary["failed"][image_id] = f"{type(exc).__name__}: {getattr(exc, 'detail', None) or exc}"
            continue
        summary["done"].append({"image": image_id, "seg_series": seg_series})
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(summary, indent=1))
    return 3 if "stopped" in summary else 1 if summary["failed"] else 0


def preannotate_one(store, task, image_id: str, request: dict, findings: list[str]) -> str:
    """XFlow's answer for one series, stored as a SEG; returns the SEG's SeriesInstanceUID."""
    import os

    label_file, params = task(
        {**request, "store_seg": True, "image": store.get_image_uri(image_id), "image_id": image_id}
    )
    if request.get("revise", True):  # Stage 2 ran: also keep what Next Sample auto-runs (Stage 1 only)
        from monailabel_xflow.transforms.labels import load_image

        task.runtime.get().prepare(load_image(store.get_image_uri(image_id), image_id)[0])
    os.unlink(label_file)
    return store.store_seg(
        image_id,
        None,
        findings=findings,
        description=f"XFlow: {params['answer']}"[:64],
        masks=params["store_seg"]["masks"],
    )  # each finding's full mask, overlaps kept; the label map painted from them
