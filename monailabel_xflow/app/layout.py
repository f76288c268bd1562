"""Images in, in the layout MONAI Label clients expect; label files are :mod:`monailabel_xflow.transforms.labels`.

Inside XFlow arrays are ``(H, W)``; MONAI Label, Slicer and OHIF hold a radiograph as MONAI's
readers do (``(W, H)`` PNG, ``(W, H, 1)`` NIfTI with an affine). :func:`load_image` loads through
:func:`monailabel_xflow.transforms.load_cxr` (the one transpose) and returns the
:class:`~monailabel_xflow.transforms.labels.ImageRef` a label must match.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from monailabel_xflow.app.errors import ImageNotFoundError
from monailabel_xflow.transforms.labels import ImageRef


def load_image(path: str | os.PathLike | None, image_id: str | None = None) -> tuple[np.ndarray, ImageRef]:
    """Load the radiograph of a request: ``(image, ref)``, ``float32 (H, W)`` in ``[0, 1]`` and the
    geometry a label must match. ``path`` is the file MONAI Label resolved (``""`` for an unknown id).

    Raises:
        ImageNotFoundError: no file (unknown image id).
        CXRLoadError: not a loadable frontal radiograph.
    """
    if not path or not os.path.exists(path):
        raise ImageNotFoundError(f"unknown image {image_id or path!r}: the datastore has no such image")
    if os.path.isdir(path):
        from monailabel_xflow.transforms.loading import CXRLoadError

        raise CXRLoadError(path, "a DICOM series folder; the app needs MONAI_LABEL_DICOMWEB_CONVERT_TO_NIFTI=true")
    from monailabel_xflow.transforms.loading import load_cxr

    image, meta = load_cxr(path)
    _refuse_lateral_series(path)
    ref = ImageRef(
        str(path), (int(image.shape[0]), int(image.shape[1])), str(meta["format"]), meta.get("spacing"), meta
    )
    return image, ref


def _refuse_lateral_series(path: str | os.PathLike) -> None:
    """A NIfTI cached by the DICOMweb datastore lost the DICOM tags; its series folder (same name
    without ``.nii.gz``) still has them: the loader's lateral-view rule applies to them."""
    series_dir = Path(str(path)[: -len(".nii.gz")]) if str(path).endswith(".nii.gz") else None
    if series_dir is None or not series_dir.is_dir():
        return
    first = next(iter(sorted(series_dir.glob("*.dcm"))), None)
    if first is not None:
        import pydicom

        from monailabel_xflow.transforms.loading import refuse_lateral

        refuse_lateral(pydicom.dcmread(str(first), stop_before_pixels=True), path)
