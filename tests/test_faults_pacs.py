"""Issue 34, item 3: the PACS (a real Orthanc with DICOMweb, started by the test) stopped and
restarted on the same port while the server and ``xflow preannotate`` use it.

With the PACS down: requests that need it answer 503 naming the PACS, ``/info/`` and requests on
uploaded files are still served, ``datalist()`` raises the same named error, ``xflow preannotate``
stops with exit status 3 and a message naming the PACS. After the restart the same requests
succeed, and a pre-annotation run interrupted by the stop, run again, leaves exactly one XFlow SEG
per series (no duplicates).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pydicom
import pytest
import requests
from servers import REPO, free_port, monailabel_server, orthanc_binary, orthanc_server, orthanc_upload
from test_hostile_server import png_bytes

pytestmark = [
    pytest.mark.timeout(1500),
    pytest.mark.skipif(
        orthanc_binary() is None, reason="Orthanc is not installed (apt-get install -y orthanc orthanc-dicomweb)"
    ),
]

SOURCES = ("cr.dcm", "cr_monochrome1.dcm", "dx.dcm")


class PACS:
    """An Orthanc that can be stopped and started again on the same port with the same storage."""

    def __init__(self, tmp: Path):
        self.tmp, self.port, self._stack = tmp, free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(orthanc_server(self.tmp, port=self.port))

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None


@pytest.fixture(scope="module")
def pacs(tmp_path_factory, cxr_samples, tiny_models):
    tmp = tmp_path_factory.mktemp("pacs_faults")
    models = tiny_models(tmp / "models")
    with open(models, "a") as f:
        f.write("max_new_tokens: 24\n")
    orthanc = PACS(tmp / "orthanc")
    orthanc.start()
    series = {}
    for name in SOURCES:
        path = cxr_samples / "dicom" / name
        orthanc_upload(orthanc.url, path)
        series[name] = str(pydicom.dcmread(path, stop_before_pixels=True).SeriesInstanceUID)
    try:
        with monailabel_server(f"{orthanc.url}/dicom-web", tmp / "server", conf={"models": str(models)}) as server:
            yield SimpleNamespace(orthanc=orthanc, server=server, url=server.url, series=series, tmp=tmp, models=models)
    finally:
        orthanc.stop()


def xflow_segs(pacs) -> dict[str, int]:
    """``{referenced image series: XFlow SEGs stored for it}``."""
    counts: dict[str, int] = {}
    for sid in requests.get(f"{pacs.orthanc.url}/series", timeout=60).json():
        info = requests.get(f"{pacs.orthanc.url}/series/{sid}", timeout=60).json()
        if info["MainDicomTags"].get("Modality") != "SEG":
            continue
        inst = info["Instances"][0]
        ds = pydicom.dcmread(io.BytesIO(requests.get(f"{pacs.orthanc.url}/instances/{inst}/file", timeout=60).content))
        if str(getattr(ds, "ContentLabel", "")) != "XFLOW_AUTO":
            continue
        ref = str(ds.ReferencedSeriesSequence[0].SeriesInstanceUID)
        counts[ref] = counts.get(ref, 0) + 1
    return counts


def preannotate(pacs, *extra: str, background: bool = False):
    cmd = [
        sys.executable,
        "-c",
        "import sys; from monailabel_xflow.cli import main; sys.exit(main(sys.argv[1:]))",
        "preannotate",
        "--studies",
        f"{pacs.orthanc.url}/dicom-web",
        "--finding",
        "edema",
        "--no-revise",
        "--models",
        str(pacs.models),
        "--cache",
        str(pacs.tmp / "pre-cache"),
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("XFLOW_")}
    env["PYTHONPATH"] = str(REPO)
    if background:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)


def infer(pacs, image, params, **kw):
    return requests.post(
        f"{pacs.url}/infer/xflow",
        params={"image": image, "output": "json"},
        data={"params": json.dumps(params)},
        timeout=600,
        **kw,
    )


def test_pacs_down_is_named_local_requests_still_served_and_all_works_after(pacs, cxr_samples):
    cr = pacs.series["cr.dcm"]
    assert infer(pacs, cr, {"instruction": "edema", "revise": False}).status_code == 200  # cached
    pacs.orthanc.stop()
    try:
        info = requests.get(f"{pacs.url}/info/", timeout=60)
        assert info.status_code == 200, info.text
        assert "PACS at 127.0.0.1" not in json.dumps(info.json())  # named by URL
        assert f"PACS at {pacs.orthanc.url}" in info.json()["datastore"]["pacs"]
        for r in (
            infer(pacs, cr, {"instruction": "edema", "revise": False, "store_seg": True}),
            infer(pacs, pacs.series["dx.dcm"], {"instruction": "edema", "revise": False}),
            requests.put(
                f"{pacs.url}/datastore/label",
                params={"image": cr, "tag": "final"},
                files={"label": ("l.png", png_bytes(np.zeros((64, 64), np.uint8)))},
                timeout=60,
            ),
        ):
            assert r.status_code == 503 and f"PACS at {pacs.orthanc.url}" in r.json()["detail"], r.text
        # a request on an uploaded file needs no PACS and is served
        png = next((cxr_samples / "nih" / "images").glob("*.png")).read_bytes()
        r = requests.post(
            f"{pacs.url}/infer/xflow",
            params={"output": "json"},
            files={"file": ("a.png", png)},
            data={"params": json.dumps({"instruction": "edema", "revise": False})},
            timeout=600,
        )
        assert r.status_code == 200, r.text
        # datalist() (what training reads) names the PACS too
        from monailabel_xflow.app.datastore import make_dicomweb_datastore
        from monailabel_xflow.errors import PACSUnavailableError

        with pytest.raises(PACSUnavailableError, match=f"PACS at {pacs.orthanc.url}"):
            make_dicomweb_datastore(f"{pacs.orthanc.url}/dicom-web", cache_path=str(pacs.tmp / "dl-cache")).datalist()
        done = preannotate(pacs)
        assert done.returncode == 3 and f"PACS at {pacs.orthanc.url}" in done.stderr, done.stderr[-2000:]
    finally:
        pacs.orthanc.start()
    before = xflow_segs(pacs)
    r = infer(pacs, cr, {"instruction": "edema", "revise": False, "store_seg": True})
    assert r.status_code == 200, r.text
    assert xflow_segs(pacs).get(cr, 0) == before.get(cr, 0) + 1


def test_preannotate_interrupted_by_the_pacs_resumes_without_duplicates(pacs):
    baseline = xflow_segs(pacs)
    proc = preannotate(pacs, background=True)
    deadline = time.monotonic() + 600
    stopped = False
    while proc.poll() is None and time.monotonic() < deadline:
        if sum(xflow_segs(pacs).values()) > sum(baseline.values()):
            pacs.orthanc.stop()  # the first SEG is stored: the PACS goes away mid-run
            stopped = True
            break
        time.sleep(0.5)
    out, err = proc.communicate(timeout=600)
    if stopped:
        pacs.orthanc.start()
        assert proc.returncode in (0, 3), err[-2000:]
        if proc.returncode == 3:
            assert f"PACS at {pacs.orthanc.url}" in err and "resume" in err
    first = xflow_segs(pacs)
    resumed = preannotate(pacs)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    again = preannotate(pacs)
    assert again.returncode == 0 and json.loads(again.stdout)["done"] == []
    final = xflow_segs(pacs)
    for name, sid in pacs.series.items():  # one SEG per series with none before; none stored twice
        new = final.get(sid, 0) - baseline.get(sid, 0)
        assert new == (0 if baseline.get(sid) else 1), (name, new, baseline, first, final)
    print(f"\nPACS stopped mid-run: {stopped}; first run exit {proc.returncode}")
