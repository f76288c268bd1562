"""COCO RLE: hand-computed examples (pycocotools conventions) and a round-trip property."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from monailabel_xflow import rle


def test_column_major_runs_start_with_background():
    # F-order flattening of [[0,1],[1,1]] is 0,1,1,1 -> runs [1, 3] -> "13"
    mask = np.array([[0, 1], [1, 1]], dtype=bool)
    assert rle.encode(mask) == {"size": [2, 2], "counts": "13"}
    # Row-major would give 0,1,1,1 too; an asymmetric mask tells the orders apart:
    # [[1,0,0],[0,0,0]] column-major is 1,0,0,0,0,0 -> runs [0, 1, 5] -> "015"
    mask = np.array([[1, 0, 0], [0, 0, 0]], dtype=bool)
    assert rle.encode(mask) == {"size": [2, 3], "counts": "015"}
    # [[0,0,1],[0,0,0]]: column-major 0,0,0,0,1,0 -> runs [4, 1, 1] -> "411"
    mask = np.array([[0, 0, 1], [0, 0, 0]], dtype=bool)
    assert rle.encode(mask)["counts"] == "411"


def test_multi_character_and_delta_coding():
    # A count of 16 needs two 5-bit groups: (16 | 0x20) + 48 = '`', then 0 + 48 = '0'.
    assert rle.encode_counts([16]) == "`0"
    assert rle.decode_counts("`0") == [16]
    # From the fourth count on COCO stores the difference to counts[i-2]: 2 - 1 = 1.
    assert rle.encode_counts([5, 1, 1, 2]) == "5111"
    # A negative delta (2 - 5 = -3) is one sign-extended group: (-3 & 31) + 48 = 'M'.
    assert rle.encode_counts([1, 5, 1, 2]) == "151M"
    assert rle.decode_counts("151M") == [1, 5, 1, 2]


def test_empty_and_full_masks():
    empty = np.zeros((3, 4), dtype=bool)
    assert rle.encode(empty) == {"size": [3, 4], "counts": "<"}  # 12 + 48 = '<'
    assert not rle.decode(rle.encode(empty)).any()
    full = np.ones((3, 4), dtype=bool)
    assert rle.encode(full)["counts"] == "0<"
    assert rle.decode({"size": [3, 4], "counts": "0<"}).all()
    assert rle.area({"size": [3, 4], "counts": "0<"}) == 12


def test_decode_uncompressed_list_counts():
    mask = rle.decode({"size": [2, 3], "counts": [4, 1, 1]})
    np.testing.assert_array_equal(mask, [[0, 0, 1], [0, 0, 0]])
    assert mask.dtype == bool
    assert rle.decode({"size": [2, 3], "counts": b"411"}).sum() == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"size": [2, 2], "counts": [1, 1]},  # sums to 2, not 4
        {"size": [2, 2]},
        {"counts": "4"},
        {"size": [2, 2], "counts": "\x7f"},
        {"size": [2, 2], "counts": "`"},  # truncated multi-group count
        {"size": [2, 2], "counts": [5, -1]},
    ],
)
def test_malformed_rle_raises(bad):
    with pytest.raises(rle.RLEError):
        rle.decode(bad)


def test_encode_rejects_non_2d():
    with pytest.raises(rle.RLEError):
        rle.encode(np.zeros((2, 2, 2)))


@settings(max_examples=200, deadline=None)
@given(
    arrays(
        dtype=bool,
        shape=st.tuples(st.integers(1, 40), st.integers(1, 40)),
        elements=st.booleans(),
    )
)
def test_round_trip(mask):
    encoded = rle.encode(mask)
    assert encoded["size"] == list(mask.shape)
    assert isinstance(encoded["counts"], str)
    np.testing.assert_array_equal(rle.decode(encoded), mask)
    assert rle.area(encoded) == int(mask.sum())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=30))
def test_counts_string_round_trip(counts):
    assert rle.decode_counts(rle.encode_counts(counts)) == counts


def test_validate_without_decoding():
    assert rle.validate({"size": [2, 3], "counts": "411"}) == (2, 3)
    with pytest.raises(rle.RLEError, match="sum"):
        rle.validate({"size": [2, 3], "counts": "41"})


def test_lazy_rle_encodes_on_first_read_only():
    mask = np.zeros((7, 5), bool)
    mask[2:5, 1:3] = True
    expected = mask.copy()
    lazy = rle.LazyRLE(mask)
    mask[:] = False  # it keeps a copy of its own
    assert "not encoded" in repr(lazy)
    np.testing.assert_array_equal(rle.decode(lazy), expected)
    assert rle.area(lazy) == 6 and "not encoded" in repr(lazy)  # decode and area need no encoding
    plain = dict(lazy)
    assert plain == rle.encode(rle.decode(lazy)) and lazy == plain and "encoded" in repr(lazy)
    np.testing.assert_array_equal(rle.decode(plain), rle.decode(lazy))
    with pytest.raises(rle.RLEError, match="2-D"):
        rle.LazyRLE(np.zeros(4, bool))


def test_an_rle_larger_than_any_radiograph_or_with_fractional_runs_is_refused():
    """A CheXlocalize entry of size 100000 x 100000 made the reader allocate 9.3 GiB; float runs
    were truncated and reported as a wrong sum."""
    from monailabel_xflow.transforms.loading import MAX_PIXELS

    assert rle.MAX_RLE_PIXELS == MAX_PIXELS
    with pytest.raises(rle.RLEError, match="over 50,000,000 pixels"):
        rle.validate({"size": [100_000, 100_000], "counts": [10_000_000_000]})
    with pytest.raises(rle.RLEError, match="list of ints"):
        rle.validate({"size": [2, 2], "counts": [1.5, 2.5]})
    assert rle.validate({"size": [2, 2], "counts": [1.0, 3]}) == (2, 2)  # whole floats are counts
