"""The XFlow app on a real PACS: Orthanc + DICOMweb, CR radiographs, labels stored as DICOM SEG.

Orthanc runs on loopback with a temporary storage folder; the MONAI Label server reads it with
``--studies http://127.0.0.1:PORT/dicom-web`` and the CR/DX series filter (the serve
command's environment). Uploaded: the test CR (PA, made from an NIH PNG), its MONOCHROME1 variant, a
lateral copy (new UIDs) and a CT-labelled copy the filter must hide.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pydicom
import pytest
from pydicom.uid import generate_uid
from servers import monailabel_server, orthanc_binary, orthanc_server, orthanc_upload

from monailabel_xflow.transforms import labels as label_io

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        orthanc_binary() is None, reason="Orthanc is not installed (apt-get install -y orthanc orthanc-dicomweb)"
    ),
]


def renamed(source, out, **tags):
    """A copy of a DICOM file with fresh study/series/instance UIDs and some tags changed."""
    ds = pydicom.dcmread(source)
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.SOPInstanceUID = generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    for key, value in tags.items():
        setattr(ds, key, value)
    ds.save_as(out)
    return out


@pytest.fixture(scope="module")
def pacs(tmp_path_factory, cxr_samples, tiny_models):
    tmp = tmp_path_factory.mktemp("orthanc")
    cr = cxr_samples / "dicom" / "cr.dcm"
    files = {
        "pa": cr,
        "mono1": renamed(cxr_samples / "dicom" / "cr_monochrome1.dcm", tmp / "mono1.dcm"),
        "lateral": renamed(cr, tmp / "lateral.dcm", ViewPosition="LL"),
        "ct": renamed(cr, tmp / "ct.dcm", Modality="CT"),
    }
    series = {k: str(pydicom.dcmread(f, stop_before_pixels=True).SeriesInstanceUID) for k, f in files.items()}
    models = tiny_models(tmp / "models")
    with orthanc_server(tmp / "orthanc") as orthanc:
        for f in files.values():
            orthanc_upload(orthanc, f)
        with monailabel_server(f"{orthanc}/dicom-web", tmp / "server", conf={"models": str(models)}) as server:
            yield SimpleNamespace(
                orthanc=orthanc, server=server, client=server.client(tmp), series=series, files=files, tmp=tmp
            )


def seg_labels(pacs) -> dict[str, np.ndarray]:
    """Every SEG in Orthanc, read back through DICOMweb: {referenced image series: (H, W) label}."""
    from dicomweb_client import DICOMwebClient

    from monailabel_xflow.app.datastore import read_seg

    web = DICOMwebClient(url=f"{pacs.orthanc}/dicom-web")
    out = {}
    for found in web.search_for_series(search_filters={"Modality": "SEG"}):
        meta = pydicom.Dataset.from_json(found)
        for ds in web.retrieve_series(str(meta.StudyInstanceUID), str(meta.SeriesInstanceUID)):
            out[str(ds.ReferencedSeriesSequence[0].SeriesInstanceUID)] = read_seg(ds)
    return out


def test_only_cr_dx_series_are_images(pacs):
    info = pacs.client.info()
    assert info["datastore"]["total"] == 3  # the CT copy is filtered out
    log = pacs.server.proc.log.read_text()
    assert "series filter {'Modality': 'CR,DX'}" in log and "dcmqi" not in log.lower()


def test_infer_on_a_cr_series_gives_a_label_in_the_image_geometry(pacs):
    import nibabel as nib

    label, params = pacs.client.infer(
        "xflow", pacs.series["pa"], {"instruction": "effusion in the left lung", "revise": False}
    )
    ds = pydicom.dcmread(pacs.files["pa"], stop_before_pixels=True)
    img = nib.load(label)
    assert img.shape == (int(ds.Columns), int(ds.Rows), 1)  # (W, H, 1), as MONAI Label holds the series
    assert params["findings"][0]["instruction"] == "Segment the effusion in the left lung."


def test_lateral_view_is_refused(pacs):
    import requests

    r = requests.post(
        f"{pacs.server.url}/infer/xflow",
        params={"image": pacs.series["lateral"]},
        data={"params": '{"instruction": "edema"}'},
        timeout=120,
    )
    assert r.status_code == 400 and "lateral" in r.json()["detail"]


def test_saved_labels_come_back_from_orthanc_unchanged(pacs):

    # a label with a finding, from the click tool
    label, _ = pacs.client.infer(
        "xflow_revise",
        pacs.series["pa"],
        {"finding": "effusion", "foreground": [[700, 300, 0]], "background": [[200, 800, 0]]},
    )
    drawn = label_io.read_label(label)
    assert drawn.any() and set(np.unique(drawn)) == {0, 7}
    pacs.client.save_label(pacs.series["pa"], label, tag="final")
    # "no finding": XFlow's empty answer saved as it is
    empty, params = pacs.client.infer("xflow", pacs.series["mono1"], {"instruction": "edema", "revise": False})
    nothing = label_io.read_label(empty)
    if nothing.any():  # a random policy called it present: store "no finding" all the same
        import nibabel as nib

        img = nib.load(empty)
        nothing[:] = 0
        empty = str(pacs.tmp / "no_finding.nii.gz")
        nib.save(nib.Nifti1Image(np.zeros(img.shape, np.uint8), img.affine), empty)
    pacs.client.save_label(pacs.series["mono1"], empty, tag="final")

    stored = seg_labels(pacs)
    assert stored.keys() == {pacs.series["pa"], pacs.series["mono1"]}
    np.testing.assert_array_equal(stored[pacs.series["pa"]], drawn)
    assert stored[pacs.series["mono1"]].shape == nothing.shape and not stored[pacs.series["mono1"]].any()
    time.sleep(1.5)  # MONAI_LABEL_DICOMWEB_CACHE_EXPIRY=1 in the tests
    assert pacs.client.info()["datastore"]["completed"] == 2
    picked = pacs.client.next_sample("xflow_uncertainty", {})
    assert picked["id"] == pacs.series["lateral"]  # the only image without a label
