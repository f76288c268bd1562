"""A hostile client against the real server (issue 15): no file outside the datastore is read,
no request crashes the server or changes the datastore, and good clients keep their answers.

One MONAI Label server for the module (``python -m monailabel.main start_server --app
WORKSPACE``, tiny random models, stopped by pid) on a studies folder of two real radiographs.
A canary radiograph lies outside the datastore; its access time is set before its modification
time, so any read of it would move the access time (the file system's relatime rule).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import http.client
import io
import json
import os
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import numpy as np
import pytest
import requests
from PIL import Image
from servers import monailabel_server

pytestmark = pytest.mark.timeout(900)

WIDE = "wide_00000129"  # 512 wide, 400 high
SQUARE = "00004296_000"
BODY_LIMIT_MB = 16


def datastore_hashes(studies: Path) -> dict[str, str]:
    """sha256 of every file under the studies folder (images, labels, datastore_v2.json)."""
    return {
        str(p.relative_to(studies)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(studies.rglob("*"))
        if p.is_file()
    }


def png_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def nifti_bomb(path: Path, shape: tuple[int, ...], total_bytes: int | None = None) -> Path:
    """A gzipped NIfTI whose header declares ``shape`` (uint8) followed by ``total_bytes`` of
    zeros (default: all the declared voxels): a small file that expands to the full size."""
    import nibabel as nib

    header = nib.Nifti1Header()
    header.set_data_dtype(np.uint8)
    header.set_data_shape(shape)
    header["vox_offset"] = 352
    n = int(np.prod(shape)) if total_bytes is None else total_bytes
    chunk = bytes(16 * 1024 * 1024)
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(header.binaryblock + b"\0" * 4)
        while n > 0:
            f.write(chunk[: min(n, len(chunk))])
            n -= len(chunk)
    return path


def hostile_setup(tmp: Path, cxr_samples: Path, tiny_models, outside_png: str) -> tuple[Path, Path, Path]:
    """``(models.yaml, studies, outside png)``: the tiny models (text capped so a request stays
    quick), a studies folder of two real radiographs, WIDE (512 x 400) and SQUARE (384 x 384), and
    a third (256 x 256) outside it, in ``tmp/outside/<outside_png>``."""
    models = tiny_models(tmp / "models")
    with open(models, "a") as f:  # random tiny policies ramble: cap their text so a request stays quick
        f.write("max_new_tokens: 24\n")
    studies = tmp / "studies"
    studies.mkdir()
    nih = cxr_samples / "nih" / "images"
    Image.open(nih / "00000129_000.png").convert("L").resize((512, 400)).save(studies / f"{WIDE}.png")
    Image.open(nih / f"{SQUARE}.png").convert("L").resize((384, 384)).save(studies / f"{SQUARE}.png")
    outside = tmp / "outside" / outside_png
    outside.parent.mkdir()
    Image.open(nih / "00001933_000.png").convert("L").resize((256, 256)).save(outside)
    return models, studies, outside


@pytest.fixture(scope="module")
def srv(tmp_path_factory, cxr_samples, tiny_models):
    tmp = tmp_path_factory.mktemp("hostile")
    models, studies, canary = hostile_setup(tmp, cxr_samples, tiny_models, "canary.png")
    outside = canary.parent
    stat = canary.stat()
    os.utime(canary, ns=(stat.st_mtime_ns - 10**12, stat.st_mtime_ns))  # atime < mtime: a read moves it
    probe = outside / "probe.png"
    shutil.copy(canary, probe)
    os.utime(probe, ns=(stat.st_mtime_ns - 10**12, stat.st_mtime_ns))
    probe.read_bytes()
    atime_works = probe.stat().st_atime_ns > stat.st_mtime_ns - 10**12
    env = {"XFLOW_MAX_BODY_MB": str(BODY_LIMIT_MB)}
    with monailabel_server(studies, tmp / "server", conf={"models": str(models)}, env=env) as server:
        yield SimpleNamespace(
            server=server,
            url=server.url,
            studies=studies,
            tmp=tmp,
            canary=canary,
            canary_bytes=canary.read_bytes(),
            canary_atime=canary.stat().st_atime_ns,
            atime_works=atime_works,
            missing=outside / "missing.png",
            models=models,
        )


def infer(srv, model, image="", params=None, raw_params=None, files=None, query=None, timeout=600):
    q = {"image": image} if image else {}
    q.update(query or {})
    data = {"params": raw_params if raw_params is not None else json.dumps(params or {})}
    return requests.post(f"{srv.url}/infer/{model}", params=q or None, data=data, files=files, timeout=timeout)


def over_long_body(srv, path: str, declared: int, sent: int = 4096) -> tuple[int, str]:
    """A request declaring ``declared`` body bytes of which only ``sent`` are sent."""
    url = urlparse(srv.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.putrequest("PUT", path)
    conn.putheader("Content-Type", "multipart/form-data; boundary=xyz")
    conn.putheader("Content-Length", str(declared))
    conn.endheaders()
    with contextlib.suppress(OSError):
        conn.send(b"\0" * sent)
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    return resp.status, body


def nrrd_header(sizes: tuple[int, ...]) -> bytes:
    """An NRRD file whose header declares ``sizes`` (uint8, raw) with a few bytes of data."""
    head = f"NRRD0004\ntype: uint8\ndimension: {len(sizes)}\nsizes: {' '.join(map(str, sizes))}\nencoding: raw\n\n"
    return head.encode() + bytes(64)


def bad_requests(srv) -> list[tuple[str, object, str]]:
    """``(what, response, word the detail must hold)`` for every hostile request."""
    t = srv.tmp / "bad"
    t.mkdir(exist_ok=True)
    canary, missing = str(srv.canary), str(srv.missing)
    ok = {"instruction": "edema", "revise": False}
    huge_png = png_bytes(np.zeros((8000, 8000), np.uint8))  # 64 MP, ~60 kB compressed
    bomb = nifti_bomb(t / "bomb.nii.gz", (20000, 20000, 1))  # 400 MP of zeros, < 1 MB gzipped
    volume_bomb = nifti_bomb(t / "volume.nii.gz", (1024, 1024, 300), total_bytes=1 << 20)
    label_ok = png_bytes(np.zeros((400, 512), np.uint8))
    good_png = (srv.studies / f"{SQUARE}.png").read_bytes()
    img = WIDE
    traversal = "../outside/canary"
    out: list[tuple[str, object, str]] = []

    def add(what, response, word):
        out.append((what, response, word))

    # --- infer: paths in every path-like field --------------------------------------------------------
    add("params image = canary", infer(srv, "xflow", img, {**ok, "image": canary}), "may not set")
    add("params image = missing", infer(srv, "xflow", img, {**ok, "image": missing}), "may not set")
    add("query image = canary", infer(srv, "xflow", canary, ok), "invalid image id")
    add("query image = missing", infer(srv, "xflow", missing, ok), "invalid image id")
    add("query image traversal", infer(srv, "xflow", traversal, ok), "invalid image id")
    add("query image encoded traversal", infer(srv, "xflow", "..%2F..%2Fetc%2Fpasswd", ok), "invalid image id")
    add("query image with NUL", infer(srv, "xflow", "a\x00b", ok), "invalid image id")
    add("query image over-long", infer(srv, "xflow", "x" * 300, ok), "invalid image id")
    add("query image = repo file name", infer(srv, "xflow", "setup.cfg", ok), "unknown image")
    add("params label = canary", infer(srv, "xflow_revise", img, {"finding": "edema", "label": canary}), "may not set")
    add(
        "params label = missing", infer(srv, "xflow_revise", img, {"finding": "edema", "label": missing}), "may not set"
    )
    add("params session", infer(srv, "xflow", img, {**ok, "session": {"image": canary}}), "may not set")
    add(
        "params save_label with traversal tag",
        infer(srv, "xflow", img, {**ok, "save_label": True, "label_tag": "../../x"}),
        "may not set",
    )
    add("session id traversal", infer(srv, "xflow", query={"session_id": "../sessions"}, params=ok), "invalid session")
    add(
        "upload file name over-long",
        infer(srv, "xflow", params=ok, files={"file": ("a" * 300 + ".png", good_png)}),
        "file name",
    )
    # --- infer: numbers, types, work ------------------------------------------------------------------
    add(
        "max_clicks 1e400",
        infer(srv, "xflow", img, raw_params='{"instruction": "edema", "max_clicks": 1e400}'),
        "max_clicks",
    )
    add(
        "max_clicks 400 digits",
        infer(srv, "xflow", img, raw_params='{"instruction": "edema", "max_clicks": ' + "9" * 400 + "}"),
        "max_clicks",
    )
    add(
        "max_clicks NaN",
        infer(srv, "xflow", img, raw_params='{"instruction": "edema", "max_clicks": NaN}'),
        "max_clicks",
    )
    add(
        "max_clicks 5000 digits (JSON)",
        infer(srv, "xflow", img, raw_params='{"max_clicks": ' + "9" * 5000 + "}"),
        "JSON",
    )
    add("max_clicks -1", infer(srv, "xflow", img, {**ok, "max_clicks": -1}), "max_clicks")
    add("max_clicks 2.5", infer(srv, "xflow", img, {**ok, "max_clicks": 2.5}), "max_clicks")
    add("max_clicks true", infer(srv, "xflow", img, {**ok, "max_clicks": True}), "max_clicks")
    add("max_clicks as 40-char text", infer(srv, "xflow", img, {**ok, "max_clicks": "1" * 40}), "max_clicks")
    add("revise not a bool", infer(srv, "xflow", img, {**ok, "revise": "maybe"}), "revise")
    add("instruction not text", infer(srv, "xflow", img, {"instruction": 123}), "instruction")
    add("finding an object", infer(srv, "xflow", img, {"finding": {"a": 1}}), "finding must be text")
    add(
        "work over the bound",
        infer(srv, "xflow", img, {"instruction": "segment all findings", "max_clicks": 16}),
        "request too large",
    )
    add("params not JSON", infer(srv, "xflow", img, raw_params="{instruction: edema"), "JSON")
    add("params a JSON list", infer(srv, "xflow", img, raw_params='["edema"]'), "JSON object")
    add("params over 64 KiB", infer(srv, "xflow", img, {"instruction": "edema", "pad": "x" * 70000}), "bytes")
    # --- images: size bombs ---------------------------------------------------------------------------
    add("64 MP PNG upload", infer(srv, "xflow", params=ok, files={"file": ("big.png", huge_png)}), "pixels")
    add(
        "gzip-bomb NIfTI upload",
        infer(srv, "xflow", params=ok, files={"file": ("bomb.nii.gz", bomb.read_bytes())}),
        "pixels",
    )
    add(
        "volume NIfTI upload",
        infer(srv, "xflow", params=ok, files={"file": ("vol.nii.gz", volume_bomb.read_bytes())}),
        "not a 2D",
    )
    # --- revise --------------------------------------------------------------------------------------
    rev = {"finding": "edema"}
    add(
        "click Infinity",
        infer(srv, "xflow_revise", img, raw_params='{"finding": "edema", "foreground": [[Infinity, 1, 0]]}'),
        "finite",
    )
    add(
        "click 400 digits",
        infer(srv, "xflow_revise", img, raw_params='{"finding": "edema", "foreground": [[' + "9" * 400 + ", 1, 0]]}"),
        "finite",
    )
    add("clicks not a list", infer(srv, "xflow_revise", img, {**rev, "foreground": "abc"}), "foreground")
    add("too many clicks", infer(srv, "xflow_revise", img, {**rev, "foreground": [[5, 5, 0]] * 100}), "at most")
    add(
        "gzip-bomb label upload",
        infer(srv, "xflow_revise", img, rev, files={"label": ("bomb.nii.gz", bomb.read_bytes())}),
        "pixels",
    )
    add(
        "NRRD label header of 400 MP",
        infer(srv, "xflow_revise", img, rev, files={"label": ("big.nrrd", nrrd_header((20000, 20000)))}),
        "pixels",
    )
    add(
        "label upload not an image",
        infer(srv, "xflow_revise", img, rev, files={"label": ("l.png", b"junk" * 10)}),
        "label",
    )
    add("image upload not an image", infer(srv, "xflow", params=ok, files={"file": ("x.png", b"junk" * 10)}), "image")
    add("unknown infer model", infer(srv, "nope", img, ok), "nope")
    # --- datastore upload / label save --------------------------------------------------------------
    ds = f"{srv.url}/datastore"
    add(
        "save label image traversal",
        requests.put(
            f"{ds}/label", params={"image": traversal, "tag": "final"}, files={"label": ("l.png", label_ok)}, timeout=60
        ),
        "invalid image id",
    )
    add(
        "save label tag traversal",
        requests.put(
            f"{ds}/label", params={"image": img, "tag": "../../evil"}, files={"label": ("l.png", label_ok)}, timeout=60
        ),
        "invalid label tag",
    )
    add(
        "save label image absolute",
        requests.put(
            f"{ds}/label", params={"image": canary, "tag": "final"}, files={"label": ("l.png", label_ok)}, timeout=60
        ),
        "invalid image id",
    )
    add(
        "save label image = missing",
        requests.put(
            f"{ds}/label", params={"image": missing, "tag": "final"}, files={"label": ("l.png", label_ok)}, timeout=60
        ),
        "invalid image id",
    )
    add(
        "save label not an image",
        requests.put(
            f"{ds}/label", params={"image": img, "tag": "final"}, files={"label": ("l.png", b"junk" * 10)}, timeout=60
        ),
        "label",
    )
    add(
        "save label of the wrong size",
        requests.put(
            f"{ds}/label",
            params={"image": img, "tag": "final"},
            files={"label": ("l.png", png_bytes(np.zeros((40, 50), np.uint8)))},
            timeout=60,
        ),
        "the image is",
    )
    add(
        "save label values over 7",
        requests.put(
            f"{ds}/label",
            params={"image": img, "tag": "final"},
            files={"label": ("l.png", png_bytes(np.full((400, 512), 200, np.uint8)))},
            timeout=60,
        ),
        "0..7",
    )
    add(
        "save label gzip-bomb NIfTI",
        requests.put(
            f"{ds}/label",
            params={"image": img, "tag": "final"},
            files={"label": ("l.nii.gz", bomb.read_bytes())},
            timeout=60,
        ),
        "pixels",
    )
    add(
        "save label params not JSON",
        requests.put(
            f"{ds}/label",
            params={"image": img, "tag": "final"},
            data={"params": "{oops"},
            files={"label": ("l.png", label_ok)},
            timeout=60,
        ),
        "JSON",
    )
    add(
        "add image id traversal",
        requests.put(f"{ds}/image", params={"image": "../evil"}, files={"file": ("e.png", good_png)}, timeout=60),
        "invalid image id",
    )
    add(
        "add image named '.' by its file name",
        requests.put(f"{ds}/image", files={"file": ("..png", good_png)}, timeout=60),
        "invalid image id",
    )
    add(
        "add 64 MP image",
        requests.put(f"{ds}/image", params={"image": "big"}, files={"file": ("big.png", huge_png)}, timeout=60),
        "pixels",
    )
    add(
        "download image traversal",
        requests.get(f"{ds}/image", params={"image": "../../etc/passwd"}, timeout=60),
        "invalid image id",
    )
    add(
        "download label traversal",
        requests.get(f"{ds}/label", params={"label": "../x", "tag": "final"}, timeout=60),
        "invalid label id",
    )
    add(
        "image info absolute",
        requests.get(f"{ds}/image/info", params={"image": canary}, timeout=60),
        "invalid image id",
    )
    add(
        "image info = missing",
        requests.get(f"{ds}/image/info", params={"image": missing}, timeout=60),
        "invalid image id",
    )
    add(
        "delete image traversal",
        requests.delete(f"{ds}/image", params={"id": "../" + img}, timeout=60),
        "invalid image id",
    )
    add(
        "add image not an image",
        requests.put(f"{ds}/image", params={"image": "junk"}, files={"file": ("junk.png", b"junk" * 10)}, timeout=60),
        "image",
    )
    status, body = over_long_body(srv, "/datastore/image?image=x", declared=(BODY_LIMIT_MB + 1) << 20)
    add("over-long body", SimpleNamespace(status_code=status, text=body, json=lambda: json.loads(body)), "bytes")
    # --- train, scoring, active learning, other routes ----------------------------------------------
    add(
        "train lr NaN",
        requests.post(
            f"{srv.url}/train/xflow", data='{"lr": NaN}', headers={"Content-Type": "application/json"}, timeout=60
        ),
        "lr",
    )
    add(
        "train lr 1e400",
        requests.post(
            f"{srv.url}/train/xflow", data='{"lr": 1e400}', headers={"Content-Type": "application/json"}, timeout=60
        ),
        "lr",
    )
    add("train steps 10^9", requests.post(f"{srv.url}/train/xflow", json={"steps": 10**9}, timeout=60), "steps")
    add("train batch 0", requests.post(f"{srv.url}/train/xflow", json={"batch": 0}, timeout=60), "batch")
    add("train steps as text", requests.post(f"{srv.url}/train/xflow", json={"steps": "many"}, timeout=60), "steps")
    rounds = requests.post(f"{srv.url}/train/xflow", json={"interactive_rounds": 10**6}, timeout=60)
    add("train interactive_rounds 10^6", rounds, "interactive_rounds")
    sc = f"{srv.url}/scoring/xflow_uncertainty"
    add(
        "scoring id traversal",
        requests.post(sc, params={"run_sync": "true"}, json={"images": [traversal]}, timeout=60),
        "invalid image id",
    )
    add(
        "scoring id = canary",
        requests.post(sc, params={"run_sync": "true"}, json={"images": [canary]}, timeout=60),
        "invalid image id",
    )
    add(
        "scoring id = missing",
        requests.post(sc, params={"run_sync": "true"}, json={"images": [missing]}, timeout=60),
        "invalid image id",
    )
    add(
        "scoring max_clicks Infinity",
        requests.post(
            sc,
            params={"run_sync": "true"},
            data='{"max_clicks": Infinity}',
            headers={"Content-Type": "application/json"},
            timeout=60,
        ),
        "max_clicks",
    )
    add("train params a JSON list", requests.post(f"{srv.url}/train/xflow", json=[1, 2], timeout=60), "dictionary")
    add(
        "scoring max_images 0",
        requests.post(sc, params={"run_sync": "true"}, json={"max_images": 0}, timeout=60),
        "max_images",
    )
    add(
        "scoring images not a list",
        requests.post(sc, params={"run_sync": "true"}, json={"images": "all"}, timeout=60),
        "images",
    )
    add(
        "scoring over-long instruction",
        requests.post(sc, params={"run_sync": "true"}, json={"instruction": "e" * 1000}, timeout=60),
        "instruction",
    )
    add("unknown strategy", requests.post(f"{srv.url}/activelearning/nope", json={}, timeout=60), "nope")
    add(
        "active learning 5000-digit number",
        requests.post(
            f"{srv.url}/activelearning/xflow_uncertainty",
            data='{"client_id": ' + "9" * 5000 + "}",
            headers={"Content-Type": "application/json"},
            timeout=60,
        ),
        "parsing the body",
    )
    add(
        "active learning body a JSON list",
        requests.post(f"{srv.url}/activelearning/xflow_uncertainty", json=[1, 2], timeout=60),
        "dictionary",
    )
    add(
        "batch infer id traversal",
        requests.post(f"{srv.url}/batch/infer/xflow", json={"images": [traversal]}, timeout=60),
        "invalid image id",
    )
    add(
        "replace model file",
        requests.put(f"{srv.url}/model/xflow", files={"file": ("m.pt", b"x")}, timeout=60),
        "model files",
    )
    add("session path traversal", requests.get(f"{srv.url}/session/%2E%2E", timeout=60), "invalid")
    add(
        "session upload named '..'",
        requests.put(f"{srv.url}/session/", files={"files": ("x/..", good_png)}, timeout=60),
        "invalid session file name",
    )
    add(
        "session archive upload",
        requests.put(
            f"{srv.url}/session/", params={"uncompress": "true"}, files={"files": ("a.zip", b"PK\x03\x04")}, timeout=60
        ),
        "compressed",
    )
    return out


def test_hostile_requests_get_4xx_and_leave_the_datastore_byte_identical(srv):
    before = datastore_hashes(srv.studies)
    t0 = time.monotonic()
    answers = bad_requests(srv)
    seconds = time.monotonic() - t0
    assert len(answers) >= 40
    report = []
    for what, r, word in answers:
        report.append(f"{r.status_code} {what}: {json.dumps(r.json().get('detail'))[:110]}")
        assert 400 <= r.status_code < 500, (what, r.status_code, r.text[:500])
        detail = json.dumps(r.json()["detail"])
        assert word.lower() in detail.lower(), (what, detail[:300])
        assert len(r.text) < 5000, what  # nothing echoed in bulk
    print(f"\n{len(answers)} hostile requests in {seconds:.1f} s:\n" + "\n".join(report))

    # no file outside the datastore was read: same answers for an existing and a missing path,
    # the canary's bytes in no answer, its access time unchanged
    by_name = {what: r for what, r, _ in answers}
    for a, b in (
        ("params image = canary", "params image = missing"),
        ("query image = canary", "query image = missing"),
        ("params label = canary", "params label = missing"),
        ("save label image absolute", "save label image = missing"),
        ("image info absolute", "image info = missing"),
        ("scoring id = canary", "scoring id = missing"),
    ):
        assert (by_name[a].status_code, by_name[a].text) == (by_name[b].status_code, by_name[b].text)
    encoded = base64.b64encode(srv.canary_bytes[:48]).decode()
    for what, r, _ in answers:
        assert srv.canary_bytes[:48] not in r.text.encode("utf-8", "replace") and encoded not in r.text, what
    if srv.atime_works:
        assert srv.canary.stat().st_atime_ns == srv.canary_atime, "the canary was read"

    assert datastore_hashes(srv.studies) == before  # byte-identical: nothing written or half-written
    label, params = srv.server.client(srv.tmp).infer("xflow", WIDE, {"instruction": "edema", "revise": False})
    assert params["findings"][0]["finding"] == "edema" and Path(label).is_file()
    assert srv.server.proc.alive()


def revise_mask(srv, image_id: str, fg) -> tuple[int, np.ndarray]:
    r = infer(srv, "xflow_revise", image_id, {"finding": "effusion", "foreground": fg}, query={"output": "image"})
    if r.status_code != 200:
        return r.status_code, np.zeros(0)
    return 200, np.asarray(Image.open(io.BytesIO(r.content)))


def test_eight_clients_mixing_good_and_bad_requests_get_the_single_client_answers(srv):
    jobs = [(WIDE if k % 2 else SQUARE, [[40 + 37 * k, 60 + 29 * k, 0]]) for k in range(8)]
    single = [revise_mask(srv, image_id, fg) for image_id, fg in jobs]
    assert all(status == 200 for status, _ in single)
    assert sum(int((mask == 7).any()) for _, mask in single) >= 4  # the clicks mark a finding: masks
    single_infer = infer(
        srv,
        "xflow",
        WIDE,
        {"instruction": "effusion on the left", "revise": False, "trace": False},
        query={"output": "json"},
    ).json()
    before = datastore_hashes(srv.studies)
    got: dict[int, list] = {}
    bad_statuses: list[int] = []
    good_statuses: list[int] = []
    lock = threading.Lock()

    def client(k):
        image_id, fg = jobs[k]
        out = [revise_mask(srv, image_id, fg)]
        bad = [
            infer(srv, "xflow", str(srv.canary), {"instruction": "edema"}),
            infer(srv, "xflow", image_id, raw_params='{"max_clicks": 1e400, "instruction": "edema"}'),
            infer(srv, "xflow_revise", image_id, {"finding": "effusion", "label": str(srv.canary)}),
            requests.put(
                f"{srv.url}/datastore/label",
                params={"image": "../x", "tag": "final"},
                files={"label": ("l.png", b"junk")},
                timeout=600,
            ),
        ]
        answer = infer(
            srv,
            "xflow",
            WIDE,
            {"instruction": "effusion on the left", "revise": False, "trace": False},
            query={"output": "json"},
        )
        with lock:
            bad_statuses.extend(r.status_code for r in bad)
            good_statuses.append(answer.status_code)
            got[k] = [out[0], answer.json()]

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    assert len(got) == 8
    assert len(bad_statuses) == 32 and all(400 <= s < 500 for s in bad_statuses), bad_statuses
    assert good_statuses == [200] * 8, good_statuses
    for k in range(8):
        (status, mask), answer = got[k]
        assert status == 200
        np.testing.assert_array_equal(mask, single[k][1])
        assert answer["answer"] == single_infer["answer"] and answer["findings"] == single_infer["findings"]
    assert single_infer["findings"][0]["instruction"] == "Segment the effusion in the left lung."
    assert all(f["present"] == (f["pixels"] > 0) for f in single_infer["findings"])  # present <=> a mask
    assert datastore_hashes(srv.studies) == before
