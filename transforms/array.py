"""Array transforms for chest radiographs (MONAI style; the dictionary twins are in
:mod:`monailabel_xflow.transforms.dictionary`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from monai.data import MetaTensor
from monai.transforms import Transform

from monailabel_xflow.transforms.loading import PathLike, load_cxr

__all__ = ["LoadCXR", "cxr_to_metatensor"]


def cxr_to_metatensor(image: np.ndarray, meta: dict[str, Any]) -> MetaTensor:
    """Wrap an ``(H, W)`` image from :func:`~monailabel_xflow.transforms.loading.load_cxr` as a
    channel-first ``MetaTensor`` ``(1, H, W)``.

    The meta dict is carried as is, plus MONAI's bookkeeping: ``original_channel_dim = 0``
    (already channel-first, so ``EnsureChannelFirst`` leaves it alone) and an ``affine`` in the
    ``(row, col)`` index frame of this tensor, ``diag(row_mm, col_mm, 1, 1)`` (identity when the
    spacing is unknown), so MONAI's ``Spacing`` resamples to millimetres. That affine is *not*
    the one MONAI's own readers attach, whose frame is ``(W, H)``.
    """
    row_mm, col_mm = meta["spacing"] or (1.0, 1.0)
    affine = torch.diag(torch.tensor([row_mm, col_mm, 1.0, 1.0], dtype=torch.float64))
    return MetaTensor(
        torch.from_numpy(np.ascontiguousarray(image[None])), affine=affine, meta={**meta, "original_channel_dim": 0}
    )


class LoadCXR(Transform):
    """Load a chest radiograph file as a ``MetaTensor`` ``(1, H, W)``, ``float32`` in ``[0, 1]``.

    Row 0 is the top of the displayed image, column 0 its left; ``.meta`` carries the keys
    documented in :mod:`monailabel_xflow.transforms.loading` (``original_size``, ``spacing``,
    ``photometric_interpretation``, ``view_position``, ``modality``, ``filename_or_obj``,
    ``bits_stored``, ``format``). See :func:`~monailabel_xflow.transforms.loading.load_cxr` for
    the formats and the intensity pipeline.

    Meta values may be ``None`` (``spacing``, ``view_position``, ``modality`` of a PNG), which
    MONAI's ``list_data_collate`` cannot batch: batch plain tensors (e.g. after
    ``EnsureType(track_meta=False)``) or pop those keys first.

    Args:
        allow_lateral: accept lateral DICOM views (refused by default).

    Raises:
        CXRLoadError: when the file cannot be loaded (see ``load_cxr``).
    """

    def __init__(self, allow_lateral: bool = False) -> None:
        self.allow_lateral = allow_lateral

    def __call__(self, path: PathLike) -> MetaTensor:
        return cxr_to_metatensor(*load_cxr(path, allow_lateral=self.allow_lateral))
