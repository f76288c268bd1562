"""``xflow phantom``: write a set of synthetic chest radiographs with ground truth.

Example (how ``sample-data/`` was made)::

    xflow phantom --out sample-data --count 12 --seed 1 --size 512 --dicom \\
        --contact-sheet sample-data/ground-truth/contact-sheet.png
"""

from __future__ import annotations

import argparse
import sys

from monailabel_xflow.commands import int_in, not_a_folder
from monailabel_xflow.data import PHANTOM_MAX_SIZE, PHANTOM_MIN_SIZE, PHANTOM_SEEDS, PHANTOM_SET_SIZE


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "phantom",
        help="generate synthetic chest radiographs with pixel-true masks and MIMIC-ILS JSON",
        description="Write N procedural chest radiographs (PNG, optional DICOM), lesion/lung/zone "
        "masks, a MIMIC-ILS-format JSON and a radiology-style report per study "
        "(reports.csv: study_id,image_path,report; true tuples in "
        "ground-truth/report_findings.json) under --out.",
    )
    p.add_argument("--out", required=True, help="output folder (images at its top level)")
    p.add_argument("--count", type=int_in(1, PHANTOM_SET_SIZE), default=12, help="number of studies (default 12)")
    p.add_argument("--seed", type=int_in(0, PHANTOM_SEEDS - 1), default=0, help="set seed (default 0)")
    p.add_argument(
        "--size",
        type=int_in(PHANTOM_MIN_SIZE, PHANTOM_MAX_SIZE),
        default=1024,
        help=f"image side in pixels, {PHANTOM_MIN_SIZE}..{PHANTOM_MAX_SIZE} (default 1024)",
    )
    p.add_argument("--dicom", action="store_true", help="also write dicom/<stem>.dcm")
    p.add_argument("--contact-sheet", metavar="PNG", help="write an overview PNG with lesion outlines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from PIL import Image
    from tqdm import tqdm

    from monailabel_xflow.data.export import export_set, phantom_contact_sheet
    from monailabel_xflow.data.phantom import PhantomError

    if problem := not_a_folder(args.out):
        print(f"xflow phantom: --out {problem}", file=sys.stderr)
        return 2
    try:
        release, phantoms = export_set(
            Path(args.out),
            args.count,
            args.seed,
            size=args.size,
            dicom=args.dicom,
            progress=lambda it: tqdm(it, desc="phantoms", unit="img"),
        )
    except (PhantomError, OSError) as e:  # OSError: --out not writable
        print(f"xflow phantom: {e}", file=sys.stderr)
        return 2
    if args.contact_sheet:
        studies = [(sid, st) for split in release.values() for sid, st in split.items()]
        by_image = {st["image_path"]: sid for sid, st in studies}
        titles = []
        for i, ph in enumerate(phantoms):
            stem = f"phantom_{args.seed}_{i:05d}.png"
            titles.append(f"{by_image[stem]} {ph.view} CTR {ph.ctr:.2f} {','.join(ph.findings) or 'normal'}")
        sheet = phantom_contact_sheet(phantoms, titles)
        Path(args.contact_sheet).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(sheet).save(args.contact_sheet, optimize=True)
    n_pos = sum(len(st["instruction_answer_pairs"]["positive_pairs"]) for s in release.values() for st in s.values())
    n_neg = sum(len(st["instruction_answer_pairs"]["negative_pairs"]) for s in release.values() for st in s.values())
    print(f"wrote {args.count} studies, {n_pos} positive and {n_neg} negative pairs to {args.out}")
    return 0
