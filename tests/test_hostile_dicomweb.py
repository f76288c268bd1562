"""Confinement in DICOMweb mode (issue 15, item 1): a hostile client against the real server on a
real PACS (Orthanc + DICOMweb on loopback, started by the test, stopped by pid). Image ids are
SeriesInstanceUIDs that also name cache folders: paths, traversal and unknown series are refused
before anything is fetched or written, the PACS and the cache stay as they were, and a canary
file outside both is never read."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pydicom
import pytest
import requests
from PIL import Image
from servers import monailabel_server, orthanc_binary, orthanc_server, orthanc_upload

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        orthanc_binary() is None, reason="Orthanc is not installed (apt-get install -y orthanc orthanc-dicomweb)"
    ),
]


def tree_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def pacs(tmp_path_factory, cxr_samples, tiny_models):
    tmp = tmp_path_factory.mktemp("hostile_pacs")
    cr = cxr_samples / "dicom" / "cr.dcm"
    series = str(pydicom.dcmread(cr, stop_before_pixels=True).SeriesInstanceUID)
    models = tiny_models(tmp / "models")
    with open(models, "a") as f:
        f.write("max_new_tokens: 24\n")
    canary = tmp / "outside" / "canary.png"
    canary.parent.mkdir()
    Image.fromarray(np.arange(256 * 256, dtype=np.uint32).reshape(256, 256).astype(np.uint8)).save(canary)
    with orthanc_server(tmp / "orthanc") as orthanc:
        orthanc_upload(orthanc, cr)
        with monailabel_server(f"{orthanc}/dicom-web", tmp / "server", conf={"models": str(models)}) as server:
            yield SimpleNamespace(
                orthanc=orthanc,
                server=server,
                url=server.url,
                series=series,
                tmp=tmp,
                canary=canary,
                cache=tmp / "server" / "dicomweb-cache",
            )


def infer(pacs, model, image, params, output="json"):
    return requests.post(
        f"{pacs.url}/infer/{model}",
        params={"image": image, "output": output},
        data={"params": json.dumps(params)},
        timeout=600,
    )


def test_dicomweb_ids_are_confined_and_the_pacs_is_untouched(pacs):
    ok = {"instruction": "edema", "revise": False}
    good = infer(pacs, "xflow", pacs.series, ok)  # fills the cache with the one real series
    assert good.status_code == 200, good.text
    instances = requests.get(f"{pacs.orthanc}/instances", timeout=30).json()
    cache = tree_hashes(pacs.cache)
    label = np.zeros((8, 8), np.uint8)
    label_file = pacs.tmp / "label.png"
    Image.fromarray(label).save(label_file)
    canary, missing = str(pacs.canary), str(pacs.canary.with_name("missing.png"))
    uid = pacs.series
    ds = f"{pacs.url}/datastore"

    def save(image, tag="final"):
        return requests.put(
            f"{ds}/label",
            params={"image": image, "tag": tag},
            files={"label": ("l.png", label_file.read_bytes())},
            timeout=120,
        )

    answers = [
        ("params image = canary", infer(pacs, "xflow", uid, {**ok, "image": canary}), 422, "may not set"),
        ("params image = missing", infer(pacs, "xflow", uid, {**ok, "image": missing}), 422, "may not set"),
        ("query image = canary", infer(pacs, "xflow", canary, ok), 400, "invalid image id"),
        ("query image = missing", infer(pacs, "xflow", missing, ok), 400, "invalid image id"),
        ("uid with traversal", infer(pacs, "xflow", f"../{uid}", ok), 400, "invalid image id"),
        ("uid '..' inside", infer(pacs, "xflow", "1.2..3", ok), 400, "invalid image id"),
        ("unknown series", infer(pacs, "xflow", "1.2.3.4.5", ok), 404, "unknown image"),
        (
            "params label = canary",
            infer(pacs, "xflow_revise", uid, {"finding": "edema", "label": canary}),
            422,
            "may not set",
        ),
        ("save label tag traversal", save(uid, "../../evil"), 400, "invalid label tag"),
        ("save label unknown series", save("1.2.3.4.5"), 404, "unknown image"),
        ("save label path id", save(canary), 400, "invalid image id"),
        (
            "download image traversal",
            requests.get(f"{ds}/image", params={"image": f"../{uid}"}, timeout=60),
            400,
            "invalid image id",
        ),
        (
            "scoring traversal",
            requests.post(
                f"{pacs.url}/scoring/xflow_uncertainty",
                params={"run_sync": "true"},
                json={"images": [f"{uid}/../x"]},
                timeout=60,
            ),
            400,
            "invalid image id",
        ),
        # issue 23: the PACS is the source of images; the logs stay closed without authentication
        (
            "upload an image",
            requests.put(
                f"{ds}/image", params={"image": "x"}, files={"file": ("x.png", label_file.read_bytes())}, timeout=60
            ),
            405,
            "PACS",
        ),
        ("delete a series", requests.delete(f"{ds}/image", params={"id": uid}, timeout=60), 405, "PACS"),
        ("logs", requests.get(f"{pacs.url}/logs/", timeout=60), 403, "authentication"),
        ("dicom_seg output", infer(pacs, "xflow", uid, ok, output="dicom_seg"), 422, "store_seg"),
    ]
    for what, r, status, word in answers:
        assert r.status_code == status, (what, r.status_code, r.text[:300])
        assert word in r.json()["detail"], (what, r.text[:300])
        assert str(pacs.tmp) not in r.text, what  # no server path in any answer
    by = {what: r for what, r, _, _ in answers}
    for a, b in (
        ("params image = canary", "params image = missing"),
        ("query image = canary", "query image = missing"),
    ):
        assert by[a].text == by[b].text  # the answer does not tell which file exists

    scored = requests.post(
        f"{pacs.url}/scoring/xflow_uncertainty",
        params={"run_sync": "true"},
        json={"images": ["1.2.3.4.5"], "max_clicks": 0},
        timeout=300,
    )
    assert scored.status_code == 200 and scored.json()["skipped"] == {"1.2.3.4.5": "unknown image"}

    assert requests.get(f"{pacs.orthanc}/instances", timeout=30).json() == instances  # nothing stored
    after = tree_hashes(pacs.cache)
    assert {k: v for k, v in after.items() if k in cache} == cache  # nothing changed in the cache ...
    assert not [k for k in after if k not in cache and ".." in k]  # ... and nothing written outside a series
    assert not (pacs.cache.parent / "evil").exists() and not any(pacs.tmp.rglob("evil*"))
    again = infer(pacs, "xflow", uid, ok)
    assert again.status_code == 200 and again.json()["findings"][0]["finding"] == "edema"
    info = requests.get(f"{ds}/image/info", params={"image": uid}, timeout=60)
    assert info.status_code == 200 and str(pacs.tmp) not in info.text  # the cache folder is not handed out
    assert pacs.server.proc.alive()
