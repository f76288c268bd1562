"""The one way the package writes a file that must survive a crash: whole or not at all.

Every file the server keeps (the datastore index ``datastore_v2.json``, images and labels copied
into the studies folder, cached SEG instances, scoring info, ``train_stats.json``) is written by
:func:`atomic_write` / :func:`atomic_copy`: a temporary file in the **same folder** (a name that no
datastore pattern matches: :func:`temp_name`), flushed and ``fsync``-ed, renamed over the target
(``os.replace``: atomic on POSIX), and the folder ``fsync``-ed so the rename itself is on disk. A
kill at any moment leaves the old file or the new one, never half of one; a leftover temporary
file is removed by :func:`remove_temps` at the next start.

A folder that must change as a whole (a trained model) is replaced by :func:`swap_dir`;
:func:`recover_dir` puts the previous one back if a kill fell between its two renames.

A damaged JSON file found at start (:func:`set_aside_damaged`) is moved aside, never deleted, and
the caller rebuilds it from the files on disk. A delete removes one folder entry itself, never a
link's target, a directory or anything outside the folder (:func:`unlink_inside`).

A full disk (``ENOSPC``/``EDQUOT``) is raised as :class:`~monailabel_xflow.errors.StorageFullError`
(HTTP 507) with the target named; the target is untouched.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from monailabel_xflow.errors import StorageFullError

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike

TEMP_MARK = ".xflow-tmp-"
"""In every temporary file's name; the name starts with ``.`` and ends with random hex, so no
``*.png``/``*.nii.gz``/``datastore_v2.json`` pattern matches it."""

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def temp_name(path: PathLike) -> Path:
    """A new temporary path beside ``path``: ``<dir>/.<name>.xflow-tmp-<hex>``."""
    p = Path(path)
    return p.with_name(f".{p.name}{TEMP_MARK}{uuid.uuid4().hex[:12]}")


def is_temp(name: str) -> bool:
    """Whether a file name is one of :func:`temp_name`'s."""
    return TEMP_MARK in name


def fsync_dir(folder: PathLike) -> None:
    """``fsync`` a folder (its entries: a rename or a new file in it is then on disk)."""
    fd = os.open(str(folder), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def storage_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a full disk or an exceeded quota."""
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


@contextlib.contextmanager
def full_disk_named(what: str) -> Iterator[None]:
    """Re-raise a full disk inside the block as :class:`StorageFullError` naming ``what``."""
    try:
        yield
    except OSError as exc:
        if storage_full(exc) and not isinstance(exc, StorageFullError):
            raise StorageFullError(
                f"no space left to write {what}: nothing was changed; free space on the server's disk and retry"
            ) from exc
        raise


def _write_via_temp(path: PathLike, fill: Callable[[IO[bytes]], Any]) -> Path:
    target = Path(path)
    tmp = temp_name(target)
    with full_disk_named(target.name):
        try:
            with open(tmp, "wb") as out:
                fill(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        fsync_dir(target.parent)
    return target


def atomic_write(path: PathLike, data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` whole or not at all (module docstring).

    Raises:
        StorageFullError: the disk is full (``path`` is unchanged).
        OSError: any other failure (``path`` is unchanged, the temporary file removed).
    """
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    return _write_via_temp(path, lambda out: out.write(raw))


def atomic_write_json(path: PathLike, value: Any, indent: int | None = 2) -> Path:
    """:func:`atomic_write` of ``json.dumps(value)`` (values JSON cannot hold written with ``str``)."""
    return atomic_write(path, json.dumps(value, indent=indent, default=str))


def atomic_copy(src: PathLike, dest: PathLike) -> Path:
    """Copy the file ``src`` to ``dest`` whole or not at all (``dest``'s own entry is replaced:
    a link there is replaced, its target untouched).

    Raises:
        StorageFullError, OSError: as :func:`atomic_write`.
    """
    with open(src, "rb") as source:
        return _write_via_temp(dest, lambda out: shutil.copyfileobj(source, out, 1 << 20))


@contextlib.contextmanager
def staged_copy(src: PathLike, dest: PathLike) -> Iterator[Path]:
    """Copy ``src`` beside ``dest`` under a temporary name (fsync-ed), run the block (e.g. write the
    index that will name ``dest``), then rename it over ``dest``; if the block raises, ``dest`` is
    untouched and the copy removed. So a full disk met by the copy or by the block changes nothing.

    Yields:
        The temporary copy's path.

    Raises:
        StorageFullError: the disk is full (nothing changed).
    """
    target = Path(dest)
    tmp = temp_name(target)
    try:
        with full_disk_named(target.name), open(src, "rb") as source, open(tmp, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        yield tmp
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_temps(folder: PathLike, recursive: bool = True) -> list[str]:
    """Remove the temporary files a kill left in ``folder`` (names with :data:`TEMP_MARK`), never
    following a link to a folder. Returns the removed paths."""
    removed: list[str] = []
    root = Path(folder)
    if not root.is_dir():
        return removed
    walker = os.walk(root) if recursive else [(str(root), [], os.listdir(root))]
    for base, dirs, names in walker:
        for name in [*names, *dirs]:
            if is_temp(name):
                path = os.path.join(base, name)
                with contextlib.suppress(OSError):
                    if os.path.islink(path) or os.path.isfile(path):
                        os.unlink(path)
                        removed.append(path)
                    elif os.path.isdir(path):
                        shutil.rmtree(path)
                        removed.append(path)
        dirs[:] = [d for d in dirs if not is_temp(d)]
    return removed


def set_aside_damaged(path: PathLike, validate: Callable[[str], Any]) -> str | None:
    """If the file at ``path`` exists and ``validate(its text)`` raises, move it to
    ``<path>.damaged-<unix time>`` (kept for a person to read) and say why; else None.

    Returns:
        A sentence naming the file, the error and where the damaged copy went, or None.
    """
    p = Path(path)
    if not p.is_file():
        return None
    try:
        validate(p.read_text(encoding="utf-8", errors="strict"))
        return None
    except Exception as exc:  # noqa: BLE001  (any failure to read or validate is damage)
        aside = p.with_name(f"{p.name}.damaged-{int(time.time())}")
        os.replace(p, aside)
        with contextlib.suppress(OSError):
            fsync_dir(p.parent)
        first = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {' '.join(first[:3])[:300]}"
        return f"{p.name} was damaged ({reason}); the damaged file was moved to {aside.name}"


def fsync_tree(folder: PathLike) -> None:
    """``fsync`` every file and folder under ``folder`` (before it is renamed into service)."""
    for base, _dirs, names in os.walk(str(folder)):
        for name in names:
            path = os.path.join(base, name)
            if os.path.isfile(path) and not os.path.islink(path):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fsync_dir(base)


def previous_dir(dest: PathLike) -> Path:
    """Where :func:`swap_dir` keeps the folder it replaces until the new one is in place."""
    d = Path(dest)
    return d.with_name(d.name + ".old")


def swap_dir(new: PathLike, dest: PathLike) -> Path:
    """Put the complete folder ``new`` in place of ``dest`` (which may not exist): ``new`` is
    fsync-ed, ``dest`` renamed to :func:`previous_dir`, ``new`` renamed to ``dest``, the previous
    one removed. A kill between the renames leaves ``dest`` missing and the previous folder whole:
    :func:`recover_dir` (and readers, through :func:`serving_dir`) take that one.

    Raises:
        StorageFullError, OSError: ``dest`` is unchanged (or recoverable as above).
    """
    new, dest = Path(new), Path(dest)
    old = previous_dir(dest)
    with full_disk_named(dest.name):
        fsync_tree(new)
        if old.exists():  # an earlier swap was interrupted after its first rename
            if dest.exists():
                shutil.rmtree(old)
            else:
                old.rename(dest)
        if dest.exists():
            dest.rename(old)
        new.rename(dest)
        fsync_dir(dest.parent)
        shutil.rmtree(old, ignore_errors=True)
    return dest


def serving_dir(dest: PathLike) -> Path | None:
    """The folder a reader should load for ``dest``: ``dest`` itself, else the previous folder of an
    interrupted :func:`swap_dir`, else None. Reads only (the server may not rename while a train
    process swaps)."""
    d = Path(dest)
    if d.is_dir():
        return d
    old = previous_dir(d)
    return old if old.is_dir() else None


def recover_dir(dest: PathLike) -> str | None:
    """At start: undo an interrupted :func:`swap_dir` of ``dest`` (the previous folder back in
    place) and remove its leftovers. Returns what was done, or None."""
    d = Path(dest)
    old = previous_dir(d)
    if old.is_dir() and not d.exists():
        old.rename(d)
        fsync_dir(d.parent)
        return f"{d.name}: a model swap was interrupted; the previous model was put back"
    if old.exists() and d.exists():
        shutil.rmtree(old, ignore_errors=True)
        return f"{d.name}: removed the leftover previous model {old.name}"
    return None


def recover_folder(folder: PathLike, swapped: tuple[str, ...] = ()) -> list[str]:
    """At start: remove the temporary files and folders a kill left directly in ``folder`` and
    undo interrupted swaps of its sub-folders ``swapped`` (:func:`recover_dir`). Returns what was
    done, one sentence each (the caller logs them). Call it only where no other process is writing
    ``folder`` at that moment (the server at start, not a task subprocess)."""
    done = [f"removed {os.path.basename(p)}, left by an interrupted write" for p in remove_temps(folder, False)]
    for name in swapped:
        line = recover_dir(Path(folder) / name)
        if line:
            done.append(line)
    return done


def unlink_inside(path: PathLike, folder: PathLike) -> bool:
    """Remove the directory entry ``path`` of ``folder`` itself: a file, or a symbolic link (its
    target stays). Never a directory, never anything outside ``folder``. Returns whether removed."""
    entry = os.path.abspath(path)
    if os.path.dirname(entry) != os.path.abspath(folder):
        logger.warning("refusing to delete %s: not an entry of %s", entry, folder)
        return False
    if os.path.islink(entry) or os.path.isfile(entry):
        os.unlink(entry)
        return True
    if os.path.isdir(entry):
        logger.warning("refusing to delete %s: a directory", entry)
    return False
