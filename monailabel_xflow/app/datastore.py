"""Datastores for radiographs: checked local folders and a DICOMweb PACS that takes CR/DX labels.

:class:`XFlowLocalDatastore` (a studies folder) refuses, before anything is written, images XFlow
cannot load (400) and labels that do not fit their image (422; unknown image: 404). A stored file
is ``<id><suffix its content shows>`` (:func:`stored_name`), so no id names the datastore's own
files; deletes unlink the entry itself, never a link's target or a directory; an image with labels
is not replaced (409: its labels describe the old pixels); info is bounded and clients cannot set
the server's keys (:func:`~monailabel_xflow.parameters.check_client_info`).

:class:`XFlowDICOMwebDatastore` (``--studies http://.../dicom-web``): images are the PACS's
(``PUT``/``DELETE`` 405); start-up never downloads dcmqi (:func:`make_dicomweb_datastore`); series
filter ``{"Modality": "CR,DX"}`` unless configured (:func:`search_filter`). The PACS side (listings,
which SEG is an image's label, SEGs stored and read without dcmqi) is
:class:`~monailabel_xflow.data.pacs.PACS`: a final label is stored as a DICOM SEG, the models'
answers as SEGs marked ``XFLOW_AUTO`` that do not count as labels
(:meth:`~XFlowDICOMwebDatastore.store_seg`); an image's label is its newest label SEG, whoever
wrote it; an unreadable SEG is skipped with its reason
(:attr:`~XFlowDICOMwebDatastore.unreadable_labels`) and the next newest counts.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.app import server_defaults
from monailabel_xflow.app.errors import ImageNotFoundError, http_errors
from monailabel_xflow.app.scoring import background_task
from monailabel_xflow.app.wraps import upstream_class
from monailabel_xflow.data.pacs import PACS, label_findings, radiograph_file, seg_label_info
from monailabel_xflow.data.seg import LABEL_CONTENT_LABEL, PREANNOTATION_CONTENT_LABEL, read_seg
from monailabel_xflow.errors import ConflictError, NotAllowedError
from monailabel_xflow.files import atomic_write_json, remove_temps, set_aside_damaged, staged_copy, unlink_inside
from monailabel_xflow.parameters import check_id, check_info_size
from monailabel_xflow.transforms import labels as label_io
from monailabel_xflow.transforms.labels import read_label, write_label
from monailabel_xflow.transforms.uploads import content_suffix

logger = logging.getLogger(__name__)

DEFAULT_SEARCH_FILTER: dict[str, str] = dict(server_defaults.SEARCH_FILTER)


MAX_STORED_NAME_BYTES = 255


def stored_name(datastore: Any, item_id: str, suffix: str) -> str:
    """``<id><suffix>``, the file name an image or label is stored under, checked.

    Raises:
        UnsafeIdError: not a plain id, starting with ``.``, or not reading back as ``item_id``
            from its stored name (MONAI Label derives ids from file names).
        RequestError: the stored name is over :data:`MAX_STORED_NAME_BYTES` bytes (422).
    """
    from monailabel_xflow.app.errors import RequestError, UnsafeIdError

    check_id(item_id, "image")
    name = f"{item_id}{suffix}"
    if item_id.startswith("."):
        raise UnsafeIdError(f"invalid image id {item_id[:40]!r}: an id may not start with '.'")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_STORED_NAME_BYTES:
        raise RequestError(
            f"image id too long: its stored name {name[:40]!r}... would be over {MAX_STORED_NAME_BYTES} bytes"
        )
    if datastore._to_id(name) != (item_id, suffix):
        raise UnsafeIdError(
            f"invalid image id {item_id[:60]!r}: it ends in or holds a file suffix, so its "
            "stored file would read back as another id"
        )
    return name


def _check_label_for(datastore: Any, image_id: str, label_filename: str) -> None:
    """Refuse a label for an unknown image, or one that does not fit the image."""
    uri = datastore.get_image_uri(image_id)
    if not uri or not os.path.exists(uri):
        raise ImageNotFoundError(f"unknown image {image_id!r}: cannot save a label for it")
    _, ref = label_io.load_image(uri, image_id)
    label_io.check_saved_label(read_label(label_filename, ref.shape))


def cache_expiry_s() -> float:
    """Seconds a DICOMweb listing is reused: ``MONAI_LABEL_DICOMWEB_CACHE_EXPIRY`` as set when asked
    (upstream's own cache fixes its expiry when MONAI Label is imported, before the app sets its
    own, :mod:`~monailabel_xflow.app.server_defaults`)."""
    from monailabel.config import settings

    return float(settings.MONAI_LABEL_DICOMWEB_CACHE_EXPIRY)


LocalDatastore: Any = upstream_class("monailabel.datastore.local.LocalDatastore")
DICOMWebDatastore: Any = upstream_class("monailabel.datastore.dicom.DICOMWebDatastore")


class DurableIndex:
    """MONAI Label's local index made crash-safe (mixed into both datastores, before MONAI Label's
    class): the index ``datastore_v2.json`` and every copied file are written whole or not at all
    (:mod:`monailabel_xflow.files`); a damaged index found at start is set aside and rebuilt from
    the files on disk (a warning says what); temporary files a kill left are removed at start;
    deletes change the index at once (not after a file-watcher event); the index moved into place
    by another process (the scoring or train subprocess) is reloaded as upstream reloads a
    modified one."""

    _xflow_recovered: str | None = None
    # MONAI Label's LocalDatastore provides these (declared for the type checker only)
    _datastore: Any
    _datastore_path: str
    _datastore_config_path: str
    _lock_file: str
    _ignore_event_config: bool
    _config_ts: float
    _to_id: Any
    _filename: Any
    _on_modify_event: Any

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self._xflow_recovered:
            labels = sum(len(o.labels) for o in self._datastore.objects.values())
            logger.warning(
                "datastore index: %s; rebuilt from the files on disk: %d images, %d labels (their "
                "client info and scores are gone; scoring runs again)",
                self._xflow_recovered,
                len(self._datastore.objects),
                labels,
            )
        handler = getattr(self, "_handler", None)
        if handler is not None:  # an atomic write is a move: reload as upstream does on a modification
            handler.on_moved = lambda event: self._on_modify_event(_Moved(event.dest_path))

    def _init_from_datastore_file(self, throw_exception: bool = False) -> None:
        if throw_exception and not getattr(self, "_xflow_index_checked", False):
            self._xflow_index_checked = True
            model = upstream_class("monailabel.datastore.local.LocalDatastoreModel")
            if background_task() is None:  # a task subprocess never removes what the server may be writing
                for path in remove_temps(self._datastore_path):
                    logger.warning("removed %s, a temporary file left by an interrupted write", path)
            self._xflow_recovered = set_aside_damaged(self._datastore_config_path, model.model_validate_json)
        return super()._init_from_datastore_file(throw_exception)  # type: ignore[misc]

    def _update_datastore_file(self, lock: bool = True) -> None:
        from filelock import FileLock

        def write() -> None:
            self._ignore_event_config = True
            atomic_write_json(self._datastore_config_path, self._datastore.model_dump(exclude={"base_path"}))
            self._config_ts = os.stat(self._datastore_config_path).st_mtime

        if lock:
            with FileLock(self._lock_file):
                write()
        else:
            write()

    def _store_label(self, image_id: str, label_filename: str, label_tag: str, label_info: dict[str, Any]) -> str:
        """MONAI Label's ``save_label``, crash- and full-disk-safe: the file is copied beside its place
        (:func:`~monailabel_xflow.files.staged_copy`), the index written, then the copy renamed into
        place; a failure at any step leaves the previous label and index as they were. A label of the
        same tag under another suffix is removed after."""
        import time

        from filelock import FileLock
        from monailabel.datastore.local import DataModel

        obj = self._datastore.objects.get(image_id)
        if obj is None:
            raise ImageNotFoundError(f"unknown image {image_id!r}: cannot save a label for it")
        _, ext = self._to_id(os.path.basename(label_filename))
        folder = self._datastore.label_path(label_tag)
        name = self._filename(image_id, ext)
        with FileLock(self._lock_file):
            os.makedirs(folder, exist_ok=True)
            previous = obj.labels.get(label_tag)
            info = dict(label_info or {})
            info.update({"ts": int(time.time()), "name": name})
            stale = self._filename(image_id, previous.ext) if previous is not None else None
            self._put(
                label_filename, os.path.join(folder, name), obj.labels, label_tag, DataModel(info=info, ext=ext), stale
            )
        logger.info("saved label %s of %s (%s)", label_tag, image_id, name)
        return image_id

    def _put(self, src: str, dest: str, entries: dict[str, Any], key: str, value: Any, stale: str | None) -> None:
        """Copy ``src`` to ``dest`` and set ``entries[key] = value`` in the index as one step (the
        index's lock held by the caller): the copy is staged beside ``dest``
        (:func:`~monailabel_xflow.files.staged_copy`), the index written, then the copy renamed into
        place; a failure at any step (a full disk) leaves both as they were. ``stale``, the entry's
        previous file name in ``dest``'s folder, is removed after when it is not ``dest``'s."""
        previous = entries.get(key)
        with staged_copy(src, dest):
            entries[key] = value
            try:
                self._update_datastore_file(lock=False)
            except BaseException:
                if previous is None:
                    entries.pop(key, None)
                else:
                    entries[key] = previous
                raise
        folder = os.path.dirname(dest)
        if stale and stale != os.path.basename(dest):
            unlink_inside(os.path.join(folder, stale), folder)

    def _forget(self, image_id: str, tags: list[str] | None) -> bool:
        """Unlink the labels ``tags`` of ``image_id`` (all and the image itself when None) and drop
        them from the index, under the index's lock. Returns whether the index held them."""
        from filelock import FileLock

        with FileLock(self._lock_file):
            obj = self._datastore.objects.get(image_id)
            if obj is None:
                return False
            for tag in list(obj.labels) if tags is None else tags:
                label = obj.labels.pop(tag, None)
                if label is not None:
                    folder = self._datastore.label_path(tag)
                    unlink_inside(os.path.join(folder, self._filename(image_id, label.ext)), folder)
            if tags is None:
                folder = self._datastore.image_path()
                unlink_inside(os.path.join(folder, self._filename(image_id, obj.image.ext)), folder)
                self._datastore.objects.pop(image_id, None)
            self._update_datastore_file(lock=False)
        return True


class _Moved:
    def __init__(self, path: str):
        self.src_path = path


class XFlowLocalDatastore(DurableIndex, LocalDatastore):
    """``LocalDatastore`` that validates uploads first (see module docstring); every id and tag
    is a plain name (:func:`~monailabel_xflow.parameters.check_id`), so no request can make
    it read or write outside its folder."""

    def add_image(self, image_id: str, image_filename: str, image_info: dict[str, Any]) -> str:
        """Store a loadable radiograph as ``<id><suffix of its content>`` (see module docstring).

        Raises (as HTTP): 400 not loadable or an unsafe id, 409 the id has labels, 413/422 info,
            507 disk full (nothing changed)."""
        import time

        from filelock import FileLock
        from monailabel.datastore.local import DataModel, ImageLabelModel

        from monailabel_xflow.transforms.loading import IMAGE_FORMATS, load_cxr

        with http_errors("add image"):
            check_id(image_id, "image")
            load_cxr(image_filename)
            name = stored_name(self, image_id, content_suffix(image_filename, IMAGE_FORMATS, "image"))
            ext = name[len(image_id) :]
            info = dict(image_info or {})
            check_info_size(info, "image info")
            folder = self._datastore.image_path()
            with FileLock(self._lock_file):
                old = self._datastore.objects.get(image_id)
                if old is not None and old.labels:
                    raise ConflictError(
                        f"image {image_id!r} has labels ({', '.join(sorted(old.labels))}) that describe "
                        "its current pixels: delete it first (its labels go with it) or upload under a "
                        "new id"
                    )
                dest = os.path.join(folder, name)
                if os.path.isdir(dest) or (os.path.lexists(dest) and old is None):
                    raise ConflictError(
                        f"image {image_id!r}: the studies folder already holds {name!r} that is not this image"
                    )
                info.update({"ts": int(time.time()), "name": name})
                entry = ImageLabelModel(image=DataModel(info=info, ext=ext))
                stale = self._filename(image_id, old.image.ext) if old is not None else None
                self._put(image_filename, dest, self._datastore.objects, image_id, entry, stale)
            logger.info("added image %s as %s", image_id, name)
            return image_id

    def remove_image(self, image_id: str) -> None:
        """Remove the image's labels and its own directory entry (a link, never its target), and
        the image from the index at once."""
        from monailabel_xflow.app.errors import ImageNotFoundError

        with http_errors("remove image"):
            check_id(image_id, "image")
            if image_id not in self._datastore.objects:
                raise ImageNotFoundError(f"unknown image {image_id!r}: the datastore has no such image")
            if not self._forget(image_id, None):
                raise ImageNotFoundError(f"unknown image {image_id!r}: the datastore has no such image")

    def save_label(self, image_id: str, label_filename: str, label_tag: str, label_info: dict[str, Any]) -> str:
        from monailabel_xflow.app.errors import RequestError
        from monailabel_xflow.transforms.loading import LABEL_FORMATS

        with http_errors("save label"):
            check_id(image_id, "image")
            check_id(label_tag, "label tag")
            if len(label_tag.encode("utf-8", "surrogatepass")) > MAX_STORED_NAME_BYTES or label_tag.startswith("."):
                raise RequestError(
                    f"label tag {label_tag[:40]!r}... names a folder: at most {MAX_STORED_NAME_BYTES} "
                    "bytes, not starting with '.'"
                )
            _check_label_for(self, image_id, label_filename)
            suffix = content_suffix(label_filename, LABEL_FORMATS, "label")
            stored_name(self, image_id, suffix)
            if not label_filename.endswith(suffix):
                raise ConflictError(f"label file {os.path.basename(label_filename)!r} does not end in {suffix!r}")
            return self._store_label(image_id, label_filename, label_tag, label_info)

    def remove_label(self, label_id: str, label_tag: str) -> None:
        """Unlink the label's own entry in ``labels/<tag>/`` (a link, never its target) and drop it
        from the index at once."""
        check_id(label_id, "label")
        check_id(label_tag, "label tag")
        self._forget(label_id, [label_tag])

    def update_image_info(self, image_id: str, info: dict[str, Any]) -> None:
        from monailabel_xflow.app.errors import ImageNotFoundError

        with http_errors("image info"):
            check_id(image_id, "image")
            obj = self._datastore.objects.get(image_id)
            if obj is None:
                raise ImageNotFoundError(f"unknown image {image_id!r}: the datastore has no such image")
            check_info_size({**obj.image.info, **info}, "image info")
            return super().update_image_info(image_id, info)

    def update_label_info(self, label_id: str, label_tag: str, info: dict[str, Any]) -> None:
        with http_errors("label info"):
            label = self._datastore.label(check_id(label_id, "label"), check_id(label_tag, "label tag"))
            if label is not None:
                check_info_size({**label.info, **info}, "label info")
            return super().update_label_info(label_id, label_tag, info)

    def get_image_uri(self, image_id: str) -> str:
        check_id(image_id, "image")
        return super().get_image_uri(image_id)

    def get_label_uri(self, label_id: str, label_tag: str) -> str:
        check_id(label_id, "label")
        check_id(label_tag, "label tag")
        return super().get_label_uri(label_id, label_tag)


# --- DICOM SEG ------------------------------------------------------------------------------


class XFlowDICOMwebDatastore(DurableIndex, DICOMWebDatastore):
    """DICOMweb datastore for CR/DX radiographs (see module docstring)."""

    _xflow_pacs: PACS | None = None

    @property
    def pacs(self) -> PACS:
        """The PACS behind the datastore (:class:`~monailabel_xflow.data.pacs.PACS`: listings, SEGs)."""
        if self._xflow_pacs is None:
            self._xflow_pacs = PACS(self._client, self._search_filter)
        return self._xflow_pacs

    def add_image(self, image_id: str, image_filename: str, image_info: dict[str, Any]) -> str:
        """Refused (405): the PACS is the source of images (store them there with DICOMweb STOW);
        upstream would put the file in the local cache, where it shadows the PACS."""
        raise NotAllowedError(
            "images come from the PACS: store the radiograph there (DICOMweb STOW), not through PUT /datastore/image"
        )

    def remove_image(self, image_id: str) -> None:
        """Refused (405): deleting a series is the PACS's business, not the labeling server's."""
        raise NotAllowedError("images live in the PACS: delete a series there, not through DELETE /datastore/image")

    def list_images(self) -> list[str]:
        """The PACS's series under the filter, reused for :func:`cache_expiry_s`."""
        return self.pacs.images(cache_expiry_s())

    def datalist(self, full_path: bool = True) -> list[dict[str, Any]]:
        """MONAI Label's ``datalist()`` (every image with its label, cached from the PACS).

        Raises:
            PACSUnavailableError: the PACS did not answer (503, naming it); retry when it is back.
        """
        try:
            return list(super().datalist(full_path))
        except Exception as exc:
            failure = self.pacs.failure(exc)
            if failure is None:
                raise
            raise failure from exc

    def status(self) -> dict[str, Any]:
        """MONAI Label's counts for ``/info/``; when the PACS does not answer, ``/info/`` still does:
        the counts are None and ``pacs`` says why (logged as a warning)."""
        try:
            return dict(super().status())
        except Exception as exc:
            failure = self.pacs.failure(exc)
            if failure is None:
                raise
            logger.warning("datastore status: %s", failure)
            return {"total": None, "completed": None, "label_tags": {}, "pacs": str(failure)}

    def get_image_uri(self, image_id: str) -> str:
        """The cached NIfTI beside its series folder (upstream returns a temporary copy the first
        time, which loses the way back to the DICOM tags, e.g. the lateral-view check). The id is a
        plain name (it becomes a cache folder) of a series the PACS lists."""
        check_id(image_id, "image")
        if image_id not in self.list_images():
            raise ImageNotFoundError(f"unknown image {image_id!r}: no such CR/DX series in the PACS")
        uri = super().get_image_uri(image_id)
        cached = os.path.realpath(os.path.join(self._datastore.image_path(), f"{image_id}.nii.gz"))
        return cached if os.path.exists(cached) else uri

    def _series_file(self, image_id: str) -> Path:
        self.get_image_uri(image_id)  # downloads the series into the cache if needed
        return radiograph_file(Path(self._datastore.image_path()) / image_id, image_id)

    def save_label(
        self, image_id: str, label_filename: str, label_tag: str, label_info: dict[str, Any], label_id: str = ""
    ) -> str:
        from monailabel.interfaces.datastore import DefaultLabelTag

        with http_errors("save label"):
            check_id(image_id, "image")
            check_id(label_tag, "label tag")
            if image_id not in self.list_images():
                raise ImageNotFoundError(f"unknown image {image_id!r}: no such CR/DX series in the PACS")
            uri = self.get_image_uri(image_id)
            _, ref = label_io.load_image(uri, image_id)
            label = read_label(label_filename, ref.shape)
            label_io.check_saved_label(label)
            if label_tag != DefaultLabelTag.FINAL:
                return self._store_label(image_id, label_filename, label_tag, label_info)
            return self._save_final(image_id, label, label_filename, label_info)

    def _save_final(self, image_id: str, label: np.ndarray, label_filename: str, label_info: dict[str, Any]) -> str:
        from monailabel.interfaces.datastore import DefaultLabelTag

        series_uid = self.store_seg(image_id, label, content_label=LABEL_CONTENT_LABEL)
        label_info = {**(label_info or {}), **seg_label_info(series_uid, self.get_image_info(image_id), label)}
        logger.info("saved SEG %s for %s (%s)", series_uid, image_id, label_info["findings"])
        return self._store_label(image_id, label_filename, DefaultLabelTag.FINAL, label_info)

    def store_seg(
        self,
        image_id: str,
        label: np.ndarray | None,
        findings: tuple[str, ...] | list[str] = (),
        content_label: str = PREANNOTATION_CONTENT_LABEL,
        description: str = "",
        algorithm: str = "XFlow",
        masks: Mapping[str, np.ndarray] | None = None,
    ) -> str:
        """Store a label map of the image ``image_id`` (its SeriesInstanceUID) as a DICOM SEG in its
        study (:meth:`~monailabel_xflow.data.pacs.PACS.store_seg`: the arguments, the new SEG's
        SeriesInstanceUID returned); labels are listed again at the next request."""
        series_uid = self.pacs.store_seg(
            label,
            self._series_file(image_id),
            findings=findings,
            content_label=content_label,
            description=description,
            algorithm=algorithm,
            masks=masks,
        )
        clear = getattr(self.get_labeled_images, "cache_clear", None)
        if clear is not None:
            clear()
        return series_uid

    # --- which SEG is an image's label ---------------------------------------------------------

    def preannotated(self) -> dict[str, set[str]]:
        """XFlow's stored answers in the PACS (:func:`~monailabel_xflow.data.seg.xflow_answers`), for
        ``xflow preannotate`` to resume."""
        return self.pacs.answers()

    def label_series(self) -> dict[str, str]:
        """Each image's label SEG (:func:`~monailabel_xflow.data.seg.newest_label_segs`, readable ones
        only), cached for ``MONAI_LABEL_DICOMWEB_CACHE_EXPIRY`` s; storing a SEG clears the cache."""
        return self.pacs.labels(cache_expiry_s())

    def get_labeled_images(self, label_tag: str | None = None, labels: list[str] | None = None) -> list[str]:
        return sorted(self.label_series())

    def get_unlabeled_images(self, label_tag: str | None = None, labels: list[str] | None = None) -> list[str]:
        labeled = set(self.label_series())
        return [i for i in self.list_images() if i not in labeled]

    def _download_labeled_data(self) -> None:
        """Cache every image's current label (its newest label SEG) for ``datalist()``; drop
        cached labels whose SEG is gone from the PACS."""
        from monailabel.interfaces.datastore import DefaultLabelTag

        current = self.label_series()
        stale = set(LocalDatastore.get_labeled_images(self)) - set(current)
        for image_id in stale:
            cached = os.path.join(self._datastore.label_path(DefaultLabelTag.FINAL), f"{image_id}.nii.gz")
            logger.info("label of %s no longer in the PACS: removed from the cache", image_id)
            with contextlib.suppress(OSError):
                os.unlink(cached)
            with contextlib.suppress(KeyError, TypeError):
                self._datastore.objects[image_id].labels.pop(DefaultLabelTag.FINAL, None)
        if stale:
            self._update_datastore_file()

        def read(image_id: str, seg_series: str) -> None:
            self.get_image_uri(image_id)
            self.get_label_uri(seg_series, DefaultLabelTag.FINAL, image_id=image_id)

        self.pacs.read_labels(current, read, cache_expiry_s())  # an unreadable SEG: the next newest

    @property
    def unreadable_labels(self) -> dict[str, str]:
        """``{SEG SeriesInstanceUID: why it could not be read}``: label SEGs skipped by
        ``datalist()`` (logged as warnings); the image's next newest label SEG counts instead."""
        return self.pacs.unreadable

    def get_label_uri(self, label_id: str, label_tag: str, image_id: str = "") -> str:
        """Final labels: the SEG series ``label_id`` read with :func:`~monailabel_xflow.data.seg.read_seg`
        (no dcmqi) and cached as ``labels/final/<image>.nii.gz``; a newer SEG replaces the cache.
        Without ``image_id`` (``GET /datastore/label?label=<image>``), ``label_id`` is an image and
        its current label SEG is served (the cache may be older: a kill between the SEG store and
        the cache write, another tool's SEG); the cache alone when the PACS does not answer."""
        from monailabel.interfaces.datastore import DefaultLabelTag

        check_id(label_id, "label")
        check_id(label_tag, "label tag")
        if image_id:
            check_id(image_id, "image")
        if label_tag == DefaultLabelTag.FINAL and not image_id:
            try:
                current = self.label_series().get(label_id)
            except Exception as exc:
                failure = self.pacs.failure(exc)
                if failure is None:
                    raise
                logger.warning("label of %s served from the cache: %s", label_id, failure)
                current = None
            if current is not None:
                label_id, image_id = current, label_id
        if label_tag != DefaultLabelTag.FINAL or not image_id:
            return LocalDatastore.get_label_uri(self, label_id, label_tag)
        cached = os.path.join(self._datastore.label_path(DefaultLabelTag.FINAL), f"{image_id}.nii.gz")
        info = self._cached_label_info(image_id)
        if os.path.exists(cached) and info.get("SeriesInstanceUID") in (label_id, None):
            return cached
        seg = self.pacs.fetch_seg(label_id, os.path.join(self._datastore.label_path(label_tag), label_id))
        if seg is None:
            return ""
        _, ref = label_io.load_image(self.get_image_uri(image_id), image_id)
        label = read_seg(seg, ref.shape)
        tmp = write_label(label, ref)
        try:
            info = {
                **self._dicom_info(label_id),
                "SeriesInstanceUID": label_id,
                "findings": label_findings(label),
            }
            self._store_label(image_id, tmp, DefaultLabelTag.FINAL, info)
        finally:
            os.unlink(tmp)
        logger.info("label of %s from SEG %s: %s", image_id, label_id, info["findings"])
        return cached

    def _cached_label_info(self, image_id: str) -> dict[str, Any]:
        from monailabel.interfaces.datastore import DefaultLabelTag

        with contextlib.suppress(KeyError, AttributeError, TypeError):
            return dict(self._datastore.objects[image_id].labels[DefaultLabelTag.FINAL].info or {})
        return {}


def search_filter(conf: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``--conf dicomweb_search_filter`` > ``MONAI_LABEL_DICOMWEB_SEARCH_FILTER`` > CR/DX."""
    from monailabel.config import settings

    from monailabel_xflow.app.requests import dicomweb_filter_conf

    value = dicomweb_filter_conf(conf)
    if value is not None:
        return dict(value)
    if "MONAI_LABEL_DICOMWEB_SEARCH_FILTER" in os.environ:
        return dict(settings.MONAI_LABEL_DICOMWEB_SEARCH_FILTER)
    return dict(DEFAULT_SEARCH_FILTER)


def make_dicomweb_datastore(
    studies: str, conf: Mapping[str, str] | None = None, cache_path: str | None = None
) -> XFlowDICOMwebDatastore:
    """The app's remote datastore: ``MONAILabelApp._init_dicomweb_datastore`` without the dcmqi
    download, with the CR/DX filter and our SEG handling."""
    from dicomweb_client.session_utils import create_session_from_user_pass
    from monailabel.config import settings
    from monailabel.datastore.dicom import DICOMwebClientX

    session = None
    user = settings.MONAI_LABEL_DATASTORE_USERNAME or settings.MONAI_LABEL_DICOMWEB_USERNAME
    password = settings.MONAI_LABEL_DATASTORE_PASSWORD or settings.MONAI_LABEL_DICOMWEB_PASSWORD
    if user and password:
        session = create_session_from_user_pass(user, password)
    client = DICOMwebClientX(
        url=studies,
        session=session,
        qido_url_prefix=settings.MONAI_LABEL_QIDO_PREFIX,
        wado_url_prefix=settings.MONAI_LABEL_WADO_PREFIX,
        stow_url_prefix=settings.MONAI_LABEL_STOW_PREFIX,
    )
    cache = (
        cache_path or settings.MONAI_LABEL_DICOMWEB_CACHE_PATH or settings.MONAI_LABEL_DATASTORE_CACHE_PATH or ""
    ).strip()
    flt = search_filter(conf)
    logger.info("DICOMweb datastore %s, series filter %s, cache %s", studies, flt, cache or "~/.cache/monailabel")
    return XFlowDICOMwebDatastore(
        client=client,
        search_filter=flt,
        cache_path=cache or None,
        fetch_by_frame=settings.MONAI_LABEL_DICOMWEB_FETCH_BY_FRAME,
        convert_to_nifti=True,
    )
