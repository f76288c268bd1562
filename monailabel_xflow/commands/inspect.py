"""``xflow inspect IMAGE``: show what the CXR loading transforms read from a file.

Prints one JSON object on stdout: ``path``, ``format``, ``shape`` (of the ``MetaTensor``
``LoadCXR`` returns, ``[1, H, W]``), ``dtype``, ``min``, ``max``, ``original_size`` ``[H, W]``,
``spacing`` ``[row_mm, col_mm]`` or null, ``photometric_interpretation``, ``view_position``,
``modality`` and ``bits_stored``. A file that cannot be loaded prints the
:class:`~monailabel_xflow.transforms.loading.CXRLoadError` on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="load a chest radiograph with the XFlow transforms and print what was read (JSON)",
        description="Load IMAGE (PNG, JPEG, DICOM or NIfTI) with LoadCXR and print a JSON object: "
        "path, format, shape [1, H, W], dtype, min, max, original_size [H, W], spacing "
        "[row_mm, col_mm] or null, photometric_interpretation, view_position, modality, "
        "bits_stored. Exit status 2 with the reason on stderr when it cannot be loaded.",
    )
    parser.add_argument("image", type=Path, help="PNG, JPEG, DICOM or NIfTI file")
    parser.add_argument(
        "--allow-lateral",
        action="store_true",
        help="accept lateral views (refused by default: XFlow reads frontal views)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from monailabel_xflow.transforms import CXRLoadError, LoadCXR

    try:
        image = LoadCXR(allow_lateral=args.allow_lateral)(args.image)
    except CXRLoadError as exc:
        print(f"xflow inspect: {exc}", file=sys.stderr)
        return 2
    meta = image.meta
    report = {
        "path": meta["filename_or_obj"],
        "format": meta["format"],
        "shape": list(image.shape),
        "dtype": str(image.dtype).removeprefix("torch."),
        "min": float(image.min()),
        "max": float(image.max()),
        "original_size": list(meta["original_size"]),
        "spacing": list(meta["spacing"]) if meta["spacing"] else None,
        "photometric_interpretation": meta["photometric_interpretation"],
        "view_position": meta["view_position"],
        "modality": meta["modality"],
        "bits_stored": meta["bits_stored"],
    }
    print(json.dumps(report, indent=2))
    return 0
