"""COCO-compatible run-length encoding of binary masks.

The format is the one pycocotools (``maskApi.c``) reads and writes, so CheXlocalize's radiologist
masks and anything exported here round-trip with COCO tools:

- ``{"size": [H, W], "counts": ...}`` with ``H`` rows and ``W`` columns;
- runs are taken over the mask flattened in **column-major** (Fortran) order, i.e. down the first
  column, then the second, ...;
- runs alternate background / foreground and always start with background (a mask whose first
  pixel is foreground starts with a run of length 0);
- ``counts`` is either a list of ints ("uncompressed RLE") or COCO's compressed ASCII string: each
  count (from the fourth on, as the difference to the count two places earlier) is written as a
  little-endian sequence of signed 5-bit groups, each character = group + 48, bit 0x20 set when
  more groups follow.

Pure numpy; no pycocotools needed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.errors import InputError

__all__ = ["RLEError", "LazyRLE", "encode", "decode", "encode_counts", "decode_counts", "area", "validate"]


class RLEError(InputError):
    """An RLE object is malformed (bad size, bad counts, counts not summing to H*W)."""


def encode_counts(counts: Sequence[int]) -> str:
    """Compress run lengths into COCO's ASCII string (``rleToString`` in maskApi.c).

    Args:
        counts: non-negative run lengths, background first.

    Returns:
        The compressed string.
    """
    out: list[str] = []
    for i, count in enumerate(counts):
        x = int(count)
        if i > 2:  # COCO delta-codes from the fourth count on (its ``i > 2``, not ``i >= 2``)
            x -= int(counts[i - 2])
        more = True
        while more:
            c = x & 0x1F
            x >>= 5  # arithmetic shift: negative deltas end at x == -1
            more = (x != -1) if (c & 0x10) else (x != 0)
            if more:
                c |= 0x20
            out.append(chr(c + 48))
    return "".join(out)


def decode_counts(text: str) -> list[int]:
    """Decompress COCO's ASCII string into run lengths (``rleFrString`` in maskApi.c).

    Raises:
        RLEError: a character outside the alphabet or a truncated final count.
    """
    counts: list[int] = []
    p, n = 0, len(text)
    while p < n:
        x, k, more = 0, 0, True
        while more:
            if p >= n:
                raise RLEError("compressed RLE string ends in the middle of a count")
            c = ord(text[p]) - 48
            if not 0 <= c < 64:
                raise RLEError(f"invalid character {text[p]!r} in compressed RLE string")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and (c & 0x10):
                x |= -1 << (5 * k)  # sign-extend
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts


def encode(mask: NDArray[Any]) -> dict[str, Any]:
    """Run-length encode a 2-D binary mask in COCO's compressed form.

    Args:
        mask: array of shape (H, W); any dtype, non-zero = foreground.

    Returns:
        ``{"size": [H, W], "counts": str}``.

    Raises:
        RLEError: if ``mask`` is not 2-D.
    """
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise RLEError(f"mask must be 2-D (H, W), got shape {mask.shape}")
    h, w = mask.shape
    flat = mask.astype(bool).ravel(order="F")
    if flat.size == 0:
        return {"size": [int(h), int(w)], "counts": encode_counts([0])}
    # Positions where the value changes, plus both ends; the first run is background.
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate(([0], change, [flat.size]))
    runs = np.diff(bounds).tolist()
    if flat[0]:
        runs = [0] + runs
    return {"size": [int(h), int(w)], "counts": encode_counts(runs)}


class LazyRLE(Mapping[str, Any]):
    """The COCO RLE of a mask, encoded when it is first read (a trace that is never written costs
    no encoding).

    Holds the mask bit-packed (an eighth of a bool array, a copy of its own), reads as
    ``{"size": [H, W], "counts": str}`` once asked (``dict(lazy)`` is the plain RLE), and
    :func:`decode` / :func:`area` take it without encoding.

    Args:
        mask: ``(H, W)`` array, non-zero = foreground.

    Raises:
        RLEError: ``mask`` not 2-D.
    """

    __slots__ = ("_bits", "_shape", "_rle")

    def __init__(self, mask: NDArray[Any]) -> None:
        array = np.asarray(mask)
        if array.ndim != 2:
            raise RLEError(f"mask must be 2-D (H, W), got shape {array.shape}")
        self._shape: tuple[int, int] = (int(array.shape[0]), int(array.shape[1]))
        self._bits = np.packbits(array.astype(bool, copy=False), axis=None)
        self._rle: dict[str, Any] | None = None

    def mask(self) -> NDArray[np.bool_]:
        """The ``(H, W)`` bool mask (a new array)."""
        count = self._shape[0] * self._shape[1]
        return np.unpackbits(self._bits, count=count).astype(bool).reshape(self._shape)

    def _encoded(self) -> dict[str, Any]:
        if self._rle is None:
            self._rle = encode(self.mask())
        return self._rle

    def __getitem__(self, key: str) -> Any:
        return self._encoded()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(("size", "counts"))

    def __len__(self) -> int:
        return 2

    def __repr__(self) -> str:
        state = "encoded" if self._rle is not None else "not encoded yet"
        return f"LazyRLE(size={list(self._shape)}, {state})"


MAX_RLE_PIXELS = 50_000_000
"""Largest RLE decoded: the loader's bound on a radiograph (``transforms.loading.MAX_PIXELS``)."""


def _size(rle: Mapping[str, Any]) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in rle["size"])
    except (KeyError, TypeError, ValueError) as err:
        raise RLEError(
            f"RLE needs 'size': [H, W], got {rle.get('size') if isinstance(rle, Mapping) else rle!r}"
        ) from err
    if h < 0 or w < 0:
        raise RLEError(f"RLE size must be non-negative, got {[h, w]}")
    if h * w > MAX_RLE_PIXELS:  # decoding would allocate H*W bytes
        raise RLEError(f"RLE size {h}x{w} is over {MAX_RLE_PIXELS:,} pixels, larger than any radiograph read here")
    return h, w


def _counts(rle: Mapping[str, Any]) -> list[int]:
    if not isinstance(rle, Mapping) or "counts" not in rle:
        raise RLEError("RLE needs a 'counts' entry")
    counts = rle["counts"]
    if isinstance(counts, bytes):
        counts = counts.decode("ascii")
    if isinstance(counts, str):
        return decode_counts(counts)
    try:
        values = [int(c) for c in counts]
        if any(v != c for v, c in zip(values, counts, strict=True)):  # 100.7 read as 100 before
            raise ValueError("not integers")
    except (TypeError, ValueError) as err:
        raise RLEError(f"RLE counts must be a string or a list of ints, got {counts!r:.60}") from err
    if any(v < 0 for v in values):
        raise RLEError("RLE counts must be non-negative")
    return values


def decode(rle: Mapping[str, Any]) -> NDArray[np.bool_]:
    """Decode a COCO RLE (compressed string or uncompressed list counts) to a mask.

    Args:
        rle: ``{"size": [H, W], "counts": str | bytes | list[int]}``.

    Returns:
        bool array of shape (H, W).

    Raises:
        RLEError: malformed object, negative runs, or runs not summing to H*W.
    """
    if isinstance(rle, LazyRLE):
        return rle.mask()
    h, w = _size(rle)
    counts = _counts(rle)
    if any(c < 0 for c in counts):
        raise RLEError("RLE decodes to a negative run length")
    total = sum(counts)
    if total != h * w:
        raise RLEError(f"RLE runs sum to {total}, expected H*W = {h}*{w} = {h * w}")
    values = np.zeros(len(counts), dtype=bool)
    values[1::2] = True
    flat = np.repeat(values, counts)
    return flat.reshape((h, w), order="F")


def area(rle: Mapping[str, Any]) -> int:
    """Number of foreground pixels of an RLE, without decoding it to a mask."""
    if isinstance(rle, LazyRLE):
        return int(np.count_nonzero(rle.mask()))
    return int(sum(_counts(rle)[1::2]))


def validate(rle: Mapping[str, Any]) -> tuple[int, int]:
    """Check an RLE without decoding it to pixels; returns its (H, W).

    Raises:
        RLEError: as :func:`decode` would.
    """
    h, w = _size(rle)
    counts = _counts(rle)
    if any(c < 0 for c in counts):
        raise RLEError("RLE decodes to a negative run length")
    if sum(counts) != h * w:
        raise RLEError(f"RLE runs sum to {sum(counts)}, expected H*W = {h}*{w} = {h * w}")
    return h, w
