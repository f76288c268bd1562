"""DICOM SEG for radiographs (monailabel_xflow.app.seg): structure, codes, geometry, round trips."""

from __future__ import annotations

import numpy as np
import pydicom
import pytest
from pydicom.uid import generate_uid

from monailabel_xflow.app.errors import LabelError
from monailabel_xflow.app.seg import (
    CATEGORY,
    FINDING_CODES,
    NO_FINDING,
    OHIF_ORIENTATION,
    read_seg,
    write_seg,
)
from monailabel_xflow.vocabulary import FINDINGS, label_value

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
        assert (s.SegmentedPropertyTypeCodeSequence[0].CodeValue, s.SegmentedPropertyTypeCodeSequence[0]
                .CodingSchemeDesignator) == (code.value, code.scheme)
        assert s.SegmentedPropertyCategoryCodeSequence[0].CodeValue == CATEGORY.value == "49755003"
    assert FINDING_CODES["effusion"].value == "60046008" and FINDING_CODES["edema"].value == "19242006"
    assert (seg.Rows, seg.Columns, int(seg.NumberOfFrames)) == (1024, 700, 4)
    assert seg.SegmentationType == "BINARY" and seg.Modality == "SEG"
    shared = seg.SharedFunctionalGroupsSequence[0]
    assert [float(v) for v in shared.PlaneOrientationSequence[0].ImageOrientationPatient] == list(OHIF_ORIENTATION)
    for frame in seg.PerFrameFunctionalGroupsSequence:
        source_ref = frame.DerivationImageSequence[0].SourceImageSequence[0]
        assert source_ref.ReferencedSOPInstanceUID == source.SOPInstanceUID
        assert [float(v) for v in frame.PlanePositionSequence[0].ImagePositionPatient] == [0.0, 0.0, 0.0]
    assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == source.SeriesInstanceUID
    assert seg.StudyInstanceUID == source.StudyInstanceUID and seg.SeriesDescription.startswith("XFlow: pneumonia")
    # the lossy source: the SEG says so, with the ratio measured from the file
    assert seg.LossyImageCompression == "01" and float(seg.LossyImageCompressionRatio) >= 1


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
