"""DICOM SEG for radiographs (monailabel_xflow.data.seg): structure, codes, geometry, round trips."""

from __future__ import annotations

import numpy as np
import pydicom
import pytest
from pydicom.uid import generate_uid

from monailabel_xflow.app.errors import LabelError
from monailabel_xflow.data.seg import PLANE_ORIENTATION, long_string, read_seg, write_seg
from monailabel_xflow.vocabulary import CATEGORY, FINDING_CODES, FINDINGS, NO_FINDING, label_value

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # highdicom on single-component names


@pytest.fixture(scope="module")
def source(cxr_samples):
    """The test CR (JPEG-compressed, made from an NIH PNG) cropped to a non-square 1024 x 700 (H x W) image."""
    ds = pydicom.dcmread(cxr_samples / "dicom" / "cr.dcm")
    pixels = ds.pixel_array[:, :700].copy()
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    ds.Columns, ds.PixelData = 700, pixels.tobytes()
    ds.SOPInstanceUID = generate_uid()
    return ds


def several_findings(shape=(1024, 700)) -> np.ndarray:
    label = np.zeros(shape, np.uint8)
    label[100:300, 50:200] = label_value("effusion")
    label[500:700, 300:500] = label_value("edema")
    label[250:320, 150:260] = label_value("pneumonia")  # overlaps the effusion: painted over it
    return label


def test_segments_are_numbered_1_to_n_with_codes_and_viewer_geometry(source):
    label = several_findings()
    seg = write_seg(label, source, findings=["opacity"])  # asked, absent: an empty segment
    segments = {int(s.SegmentNumber): s for s in seg.SegmentSequence}
    assert list(segments) == [1, 2, 3, 4]
    assert [str(s.SegmentLabel) for s in segments.values()] == ["pneumonia", "opacity", "edema", "effusion"]
    for s in segments.values():
        code = FINDING_CODES[str(s.SegmentLabel)]
        assert (
            s.SegmentedPropertyTypeCodeSequence[0].CodeValue,
            s.SegmentedPropertyTypeCodeSequence[0].CodingSchemeDesignator,
        ) == (code.value, code.scheme)
        assert s.SegmentedPropertyCategoryCodeSequence[0].CodeValue == CATEGORY.value == "49755003"
    assert FINDING_CODES["effusion"].value == "60046008" and FINDING_CODES["edema"].value == "19242006"
    assert (seg.Rows, seg.Columns, int(seg.NumberOfFrames)) == (1024, 700, 4)
    assert seg.SegmentationType == "BINARY" and seg.Modality == "SEG"
    shared = seg.SharedFunctionalGroupsSequence[0]
    assert [float(v) for v in shared.PlaneOrientationSequence[0].ImageOrientationPatient] == list(PLANE_ORIENTATION)
    for frame in seg.PerFrameFunctionalGroupsSequence:
        source_ref = frame.DerivationImageSequence[0].SourceImageSequence[0]
        assert source_ref.ReferencedSOPInstanceUID == source.SOPInstanceUID
        assert [float(v) for v in frame.PlanePositionSequence[0].ImagePositionPatient] == [0.0, 0.0, 0.0]
    assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == source.SeriesInstanceUID
    assert seg.StudyInstanceUID == source.StudyInstanceUID and seg.SeriesDescription.startswith("XFlow: pneumonia")
    # the lossy source: the SEG says so, with the ratio measured from the file
    assert seg.LossyImageCompression == "01" and float(seg.LossyImageCompressionRatio) >= 1


def test_the_series_description_of_all_findings_ends_at_a_word_within_64_characters(source):
    """All seven findings name more than DICOM's LO allows (64 characters): the description ends
    after the last whole finding name that fits, with "...", never inside a word."""
    full = "XFlow: " + ", ".join(FINDINGS)
    assert len(full) > 64
    seg = write_seg(np.zeros((1024, 700), np.uint8), source, findings=list(FINDINGS))
    text = str(seg.SeriesDescription)
    assert len(text) <= 64 and text.endswith("...") and text != full[:64]
    kept = text.removesuffix("...")
    assert full.startswith(kept) and full[len(kept)] == ","  # cut after a whole finding name
    assert kept.removeprefix("XFlow: ").split(", ") == list(FINDINGS[: kept.count(",") + 1])
    assert str(seg.ContentDescription) == "XFlow findings"
    assert str(write_seg(np.zeros((1024, 700), np.uint8), source, findings=["edema"]).SeriesDescription) == (
        "XFlow: edema"
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("short", "short"),
        ("a" * 64, "a" * 64),
        ("word " * 13 + "end", "word " * 11 + "word..."),  # 68 characters: the 12 words that fit
        ("x" * 70, "x" * 61 + "..."),  # one word longer than the limit: cut inside it
        ("back\\slash", "back/slash"),  # LO's value separator
    ],
)
def test_long_string_cuts_at_a_word_boundary(text, expected):
    assert long_string(text) == expected and len(long_string(text)) <= 64


def test_round_trip_through_a_file_is_pixel_identical(source, tmp_path):
    label = several_findings()
    write_seg(label, source, tmp_path / "seg.dcm")
    back = read_seg(tmp_path / "seg.dcm", shape=(1024, 700))
    np.testing.assert_array_equal(back, label)
    with pytest.raises(LabelError, match="700 x 1024"):
        read_seg(tmp_path / "seg.dcm", shape=(700, 1024))


def test_no_finding_is_one_empty_normal_segment(source):
    seg = write_seg(np.zeros((1024, 700), np.uint8), source)
    assert [str(s.SegmentLabel) for s in seg.SegmentSequence] == [NO_FINDING]
    assert seg.SegmentSequence[0].SegmentedPropertyTypeCodeSequence[0].CodeValue == "17621005"
    assert int(seg.NumberOfFrames) == 1 and not read_seg(seg).any()


def test_bad_labels_are_refused(source):
    with pytest.raises(LabelError, match="rows x columns"):
        write_seg(np.zeros((700, 1024), np.uint8), source)
    with pytest.raises(LabelError, match="0..7"):
        write_seg(np.full((1024, 700), 9, np.uint8), source)
    with pytest.raises(LabelError, match="unknown findings"):
        write_seg(np.zeros((1024, 700), np.uint8), source, findings=["pneumothorax"])


def test_another_tools_seg_maps_segments_by_name(source):
    """A SEG as OHIF's Segmentation mode or Slicer writes it: its own codes, names typed by a
    person, numbering of its own. Segments map by name; one naming no finding is refused."""
    label = several_findings()
    seg = write_seg(label, source)
    renamed = {"pneumonia": "Pneumonia", "edema": "pulmonary edema", "effusion": "Pleural Effusion"}
    for s in seg.SegmentSequence:
        s.SegmentLabel = renamed[str(s.SegmentLabel)]
        s.SegmentedPropertyTypeCodeSequence[0].CodeValue = "85756007"  # "Tissue", as OHIF defaults
    np.testing.assert_array_equal(read_seg(seg), label)
    seg.SegmentSequence[0].SegmentLabel = "Segment 1"
    with pytest.raises(LabelError, match="Segment 1"):
        read_seg(seg)


def test_codes_cover_the_vocabulary():
    assert tuple(FINDING_CODES) == FINDINGS
    assert len({(c.value, c.scheme) for c in FINDING_CODES.values()}) == len(FINDINGS)


def test_cardiomegaly_is_read_by_either_snomed_code(source):
    """Written as SCT 8186001; a SEG coded as PS3.16 CID 12249 has it (SCT 287272002) reads the same."""
    label = np.zeros((1024, 700), np.uint8)
    label[400:800, 200:500] = label_value("cardiomegaly")
    seg = write_seg(label, source)
    code = seg.SegmentSequence[0].SegmentedPropertyTypeCodeSequence[0]
    assert (code.CodeValue, code.CodingSchemeDesignator) == ("8186001", "SCT")
    seg.SegmentSequence[0].SegmentLabel = "Segment 1"  # no help from the name
    code.CodeValue = "287272002"
    np.testing.assert_array_equal(read_seg(seg), label)


def test_overlapping_findings_each_keep_their_full_mask(source, tmp_path):
    """The masks XFlow answered, overlapping, go into the SEG whole (the label map would cut the
    earlier finding where a later one covers it); reading gives them back, and the label map
    read from it paints them as the tasks do (later FINDINGS wins)."""
    from monailabel_xflow.data.seg import read_seg_masks

    opacity = np.zeros((1024, 700), bool)
    opacity[100:400, 100:400] = True
    effusion = np.zeros((1024, 700), bool)
    effusion[300:600, 200:500] = True
    label = np.zeros((1024, 700), np.uint8)
    label[opacity] = label_value("opacity")
    label[effusion] = label_value("effusion")
    write_seg(label, source, tmp_path / "seg.dcm", masks={"opacity": opacity, "effusion": effusion})
    back = read_seg_masks(tmp_path / "seg.dcm", (1024, 700))
    assert set(back) == {"opacity", "effusion"}
    np.testing.assert_array_equal(back["opacity"], opacity)  # 30,000 px under the effusion kept
    np.testing.assert_array_equal(back["effusion"], effusion)
    assert (back["opacity"] & back["effusion"]).sum() == 100 * 200
    np.testing.assert_array_equal(read_seg(tmp_path / "seg.dcm"), label)
    with pytest.raises(LabelError, match="edema mask of shape"):
        write_seg(label, source, masks={"edema": np.zeros((10, 10), bool)})
    with pytest.raises(LabelError, match="unknown findings"):
        write_seg(label, source, masks={"pneumothorax": opacity})


# --- what the current OHIF stores (tests/data/ohif/README.md says how these were made) -----------

OHIF_SEGS = __import__("pathlib").Path(__file__).parent / "data" / "ohif"


def _stroke_and_effusion(radius: float):
    """The phantom's effusion and the brush stroke drawn over it in OHIF (see the README there):
    a capsule of ``radius`` px around row 250, columns 330..400 (OHIF's brush: 25 mm = 32 px)."""
    from monailabel_xflow.data.phantom import generate_phantom

    effusion = generate_phantom(7, size=512, findings=("effusion",)).lesions[0].mask
    rows, cols = np.mgrid[:512, :512]
    nearest = np.clip(cols, 330, 400)
    return effusion, (cols - nearest) ** 2 + (rows - 250) ** 2 <= radius**2


@pytest.mark.parametrize("name", ["ohif-3.13.2-labelmap.dcm", "ohif-3.13.2-bitmap.dcm"])
def test_reads_what_ohif_3_13_stores_label_map_and_bitmap(name):
    """OHIF 3.13's Label Map SEG (RLE) and its bitmap SEG (RLE, 1 bit): the finding by name (OHIF
    re-codes types as "Tissue"), XFlow's effusion whole and the annotator's stroke added."""
    from monailabel_xflow.data.seg import LABELMAP_SOP_CLASS, read_seg_masks

    ds = pydicom.dcmread(OHIF_SEGS / name)
    assert (ds.SOPClassUID == LABELMAP_SOP_CLASS) == ("labelmap" in name)
    assert ds.file_meta.TransferSyntaxUID == pydicom.uid.RLELossless
    masks = read_seg_masks(ds, (512, 512))
    effusion, inner = _stroke_and_effusion(30)
    _, outer = _stroke_and_effusion(34)
    assert set(masks) == {"effusion"}
    assert (masks["effusion"] & effusion).sum() == effusion.sum()  # nothing of XFlow's mask lost
    added = masks["effusion"] & ~effusion
    assert (inner & ~effusion & ~added).sum() == 0 and added.sum() > 6000  # the stroke is in ...
    assert not (added & ~outer).any()  # ... and nothing else
    np.testing.assert_array_equal(read_seg(ds, (512, 512)), masks["effusion"] * np.uint8(label_value("effusion")))


def test_reads_ohif_3_13s_overlapping_label_map_frames():
    """Overlapping segments come back from OHIF 3.13 as two label-map frames of one image: the
    overlap survives the round trip; the stroke went into the active segment (opacity)."""
    from monailabel_xflow.data.seg import read_seg_masks

    ds = pydicom.dcmread(OHIF_SEGS / "ohif-3.13.2-labelmap-overlap.dcm")
    assert int(ds.NumberOfFrames) == 2
    masks = read_seg_masks(ds, (512, 512))
    effusion, inner = _stroke_and_effusion(30)
    np.testing.assert_array_equal(masks["effusion"], effusion)
    rows, cols = np.nonzero(effusion)
    opacity = np.zeros((512, 512), bool)
    opacity[rows.min() : rows.min() + 60, cols.min() : cols.max()] = True  # as written before OHIF opened it
    assert (masks["opacity"] & effusion).sum() == (opacity & effusion).sum() > 5000  # the overlap kept
    assert (opacity & ~masks["opacity"]).sum() == 0
    assert (inner & ~masks["opacity"]).sum() == 0  # the stroke went into the active segment


def test_unreadable_segs_say_why(source):
    """What a SEG in the PACS may get wrong is a LabelError naming it (the datastore skips such a
    SEG with that reason): a label-map value no segment describes, undecodable pixel data, a
    frame naming no segment."""
    from monailabel_xflow.data.seg import read_seg_masks

    ds = pydicom.dcmread(OHIF_SEGS / "ohif-3.13.2-labelmap.dcm")
    ds.SegmentSequence[0].SegmentNumber = 5
    with pytest.raises(LabelError, match=r"values \[1\] that no segment describes"):
        read_seg_masks(ds)
    ds = pydicom.dcmread(OHIF_SEGS / "ohif-3.13.2-bitmap.dcm")
    ds.PixelData = ds.PixelData[:40] + b"\0" * 8  # a truncated RLE stream
    with pytest.raises(LabelError, match="cannot be decoded"):
        read_seg_masks(ds)
    seg = write_seg(several_findings(), source)
    del seg.PerFrameFunctionalGroupsSequence[1].SegmentIdentificationSequence
    with pytest.raises(LabelError, match="Segment Identification"):
        read_seg_masks(seg)
