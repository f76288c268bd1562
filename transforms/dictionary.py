"""Dictionary transforms for chest radiographs: twins of :mod:`monailabel_xflow.transforms.array`."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from monai.config import KeysCollection
from monai.transforms import MapTransform

from monailabel_xflow.transforms.array import LoadCXR

__all__ = ["LoadCXRd"]


class LoadCXRd(MapTransform):
    """Dictionary twin of :class:`~monailabel_xflow.transforms.array.LoadCXR`.

    Replaces each ``data[key]`` (a file path) with the ``MetaTensor`` ``(1, H, W)`` loaded from it.

    Args:
        keys: keys holding paths to load.
        allow_lateral: accept lateral DICOM views (refused by default).
        image_only: if ``False``, also store a copy of the meta dict under
            ``f"{key}_{meta_key_postfix}"``, as ``LoadImaged(image_only=False)`` does.
        meta_key_postfix: suffix of those meta keys.
        allow_missing_keys: do not raise when a key is absent.

    Raises:
        CXRLoadError: when a file cannot be loaded.
    """

    def __init__(
        self,
        keys: KeysCollection,
        allow_lateral: bool = False,
        image_only: bool = True,
        meta_key_postfix: str = "meta_dict",
        allow_missing_keys: bool = False,
    ) -> None:
        super().__init__(keys, allow_missing_keys)
        self.loader = LoadCXR(allow_lateral=allow_lateral)
        self.image_only = image_only
        self.meta_key_postfix = meta_key_postfix

    def __call__(self, data: Mapping[Hashable, Any]) -> dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.loader(d[key])
            if not self.image_only:
                d[f"{key}_{self.meta_key_postfix}"] = dict(d[key].meta)
        return d
