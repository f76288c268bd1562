"""A second hostile client against the real server (issue 23): labels never read a file they
name, compression bombs stay bounded, ids never name the datastore's folders, deletes never leave
it, uploads are typed by content, temp files go, no 500 and no absolute path in any answer,
human labels stay human, background work is bounded, and concurrent use loses nothing.

One MONAI Label server for the module (the packaged app in a workspace, as ``xflow serve``
starts it; tiny random models; stopped by pid) on a studies folder of two radiographs and a
symbolic link to a third outside it; the server's ``TMPDIR`` is a folder of its own, so its
temporary files can be counted. Tests run in file order: the first sees a datastore without
labels.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import os
import struct
import threading
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import requests
from PIL import Image
from servers import REPO, monailabel_server
from test_hostile_server import SQUARE, WIDE, hostile_setup, png_bytes

pytestmark = pytest.mark.timeout(1200)

LINKED = "linked_00001933"
BOMB_BYTES = 512 << 20  # what each compression bomb expands to


def hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def temp_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def rss_kib(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of a process in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


@pytest.fixture(scope="module")
def srv(tmp_path_factory, cxr_samples, tiny_models):
    tmp = tmp_path_factory.mktemp("hostile2")
    models, studies, target = hostile_setup(tmp, cxr_samples, tiny_models, "admin_placed.png")
    outside = target.parent
    (studies / f"{LINKED}.png").symlink_to(target)
    canary = outside / "canary.txt"
    canary.write_bytes(b"CANARY-SECRET-" + os.urandom(8).hex().encode() + b"\n" * 64)
    stat = canary.stat()
    os.utime(canary, ns=(stat.st_mtime_ns - 10**12, stat.st_mtime_ns))  # atime < mtime: a read moves it
    server_tmp = tmp / "server-tmp"
    server_tmp.mkdir()
    env = {"XFLOW_MAX_BODY_MB": "64", "TMPDIR": str(server_tmp)}
    with monailabel_server(studies, tmp / "server", conf={"models": str(models)}, env=env) as server:
        time.sleep(1.0)
        yield SimpleNamespace(
            server=server,
            url=server.url,
            studies=studies,
            tmp=tmp,
            outside=outside,
            target=target,
            target_bytes=target.read_bytes(),
            canary=canary,
            canary_atime=canary.stat().st_atime_ns,
            server_tmp=server_tmp,
            temp_baseline=temp_files(server_tmp),
            answers=[],
        )


def call(srv, method: str, path: str, **kw):
    """One request; every answer is kept for the module's no-path check."""
    kw.setdefault("timeout", 600)
    r = requests.request(method, f"{srv.url}{path}", **kw)
    srv.answers.append((f"{method} {path}", r))
    return r


def infer(srv, model, image="", params=None, files=None, query=None, raw_params=None):
    q = {"image": image} if image else {}
    q.update(query or {})
    data = {"params": raw_params if raw_params is not None else json.dumps(params or {})}
    return call(srv, "POST", f"/infer/{model}", params=q or None, data=data, files=files)


def put_label(srv, image, name, content, tag="final", params=None):
    data = {"params": params} if params is not None else None
    return call(
        srv, "PUT", "/datastore/label", params={"image": image, "tag": tag}, files={"label": (name, content)}, data=data
    )


def put_image(srv, name, content, image=None, params=None):
    data = {"params": params} if params is not None else None
    return call(
        srv,
        "PUT",
        "/datastore/image",
        params={"image": image} if image else None,
        files={"file": (name, content)},
        data=data,
    )


def assert_4xx(r, word: str, what: str = ""):
    assert 400 <= r.status_code < 500, (what, r.status_code, r.text[:400])
    assert word.lower() in json.dumps(r.json().get("detail")).lower(), (what, r.text[:400])


# --- builders of hostile files ---------------------------------------------------------------------


def nrrd_file(sizes, encoding="raw", data=b"", extra="", type_="uint8") -> bytes:
    head = (
        f"NRRD0004\ntype: {type_}\ndimension: {len(sizes)}\nsizes: {' '.join(map(str, sizes))}\n"
        f"encoding: {encoding}\n{extra}\n"
    )
    return head.encode() + data


def stream_compress(compressor, total: int) -> bytes:
    chunk, out, left = bytes(16 << 20), [], total
    while left > 0:
        out.append(compressor.compress(chunk[: min(left, len(chunk))]))
        left -= len(chunk)
    out.append(compressor.flush())
    return b"".join(out)


def deflated_dicom_bomb(total: int) -> bytes:
    """A Deflated Explicit VR Little Endian DICOM of a 64 x 64 image followed by a private OB
    element of ``total`` zero bytes: a small file whose data set inflates to ``total``."""
    import pydicom
    from pydicom.dataset import FileMetaDataset
    from pydicom.filebase import DicomBytesIO
    from pydicom.filewriter import write_dataset, write_file_meta_info
    from pydicom.uid import DeflatedExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    ds = pydicom.Dataset()
    ds.SOPClassUID, ds.SOPInstanceUID = SecondaryCaptureImageStorage, generate_uid()
    ds.Modality, ds.ViewPosition = "DX", "PA"
    ds.Rows = ds.Columns = 64
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PixelData = (np.arange(64 * 64) % 251).astype(np.uint8).tobytes()
    body = DicomBytesIO()
    body.is_little_endian, body.is_implicit_VR = True, False
    write_dataset(body, ds)
    deflater = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    stream = deflater.compress(body.getvalue() + struct.pack("<HH2sHI", 0x7FE1, 0x1010, b"OB", 0, total))
    stream += stream_compress(deflater, total)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = ds.SOPClassUID, ds.SOPInstanceUID
    meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    out = DicomBytesIO()
    out.write(b"\0" * 128 + b"DICM")
    write_file_meta_info(out, meta, enforce_standard=True)
    return out.getvalue() + stream


def nifti_huge_extension() -> bytes:
    """A gzipped 512 x 400 NIfTI label whose header extension claims 1 GiB (a reader allocates it)."""
    import nibabel as nib

    header = nib.Nifti1Header()
    header.set_data_dtype(np.uint8)
    header.set_data_shape((512, 400, 1))
    header["vox_offset"] = 368.0
    ext = struct.pack("<ii", 1 << 30, 6) + bytes(8)
    return gzip.compress(header.binaryblock + b"\1\0\0\0" + ext + bytes(512 * 400) + bytes(1 << 20))


def nifti_far_offset(total_zeros: int) -> bytes:
    """A gzipped 512 x 400 NIfTI whose ``vox_offset`` is 2^33 (a reader seeks through the stream)."""
    import nibabel as nib

    header = nib.Nifti1Header()
    header.set_data_dtype(np.uint8)
    header.set_data_shape((512, 400, 1))
    header["vox_offset"] = float(2**33)
    return gzip.compress(header.binaryblock + b"\0" * 4 + bytes(total_zeros), compresslevel=6)


# --- 1. no 500, no path, closed routes (the datastore has no label yet) ---------------------------


def test_no_500_anywhere_and_routes_that_cannot_work_say_why(srv):
    png = (srv.studies / f"{SQUARE}.png").read_bytes()
    label = png_bytes(np.zeros((400, 512), np.uint8))
    before = hashes(srv.studies)
    cases = [
        ("dataset without labels", call(srv, "GET", "/datastore/dataset"), "no image has a final label"),
        (
            "image info not JSON",
            call(srv, "PUT", "/datastore/image/info", params={"image": WIDE}, data={"info": "{oops"}),
            "JSON",
        ),
        (
            "image info a list",
            call(srv, "PUT", "/datastore/image/info", params={"image": WIDE}, data={"info": "[1]"}),
            "JSON object",
        ),
        ("label params not JSON", put_label(srv, WIDE, "l.png", label, params="{oops"), "JSON"),
        ("image params not JSON", put_image(srv, "n.png", png, image="n1", params="{oops"), "JSON"),
        (
            "image params 5000 digits",
            put_image(srv, "n.png", png, image="n1", params='{"a": ' + "9" * 5000 + "}"),
            "JSON",
        ),
        ("deprecated all-models train", call(srv, "POST", "/train/", json={"xflow": "x"}), "deprecated"),
        # the body's model won over the URL's: 200, then a traceback in the train subprocess
        ("train body names another model", call(srv, "POST", "/train/xflow", json={"model": "other"}), "'other'"),
        (
            "dicom_seg on a folder",
            infer(srv, "xflow", WIDE, {"instruction": "edema", "revise": False}, query={"output": "dicom_seg"}),
            "dicom_seg",
        ),
        (
            "OHIF .bin scribbles",
            infer(
                srv, "xflow_revise", WIDE, {"finding": "edema"}, files={"label": ("scribbles.bin", bytes(512 * 400))}
            ),
            ".bin",
        ),
        (
            "unknown checksum",
            call(srv, "HEAD", "/datastore/image", params={"image": WIDE, "check_sum": "md7:00"}),
            None,
        ),
        ("proxy on a folder", call(srv, "GET", "/proxy/dicom/qido/studies"), "DICOMweb"),
        ("logs without auth", call(srv, "GET", "/logs/", params={"lines": 100}), "authentication"),
        ("gpu logs without auth", call(srv, "GET", "/logs/gpu"), "authentication"),
        ("NUL in upload name", put_image(srv, "a\0b.png", png), "NUL"),
        ("over-long upload name", put_image(srv, "a" * 300 + ".png", png), "255"),
        ("stored name over 255 bytes", put_image(srv, "x.png", png, image="\u00e9" * 127), "255 bytes"),
        ("label upload name NUL", put_label(srv, WIDE, "l\0.png", label), "NUL"),
        # trained on, an inverted mask was promoted and served; a colour label was read as its red
        (
            "label of one finding everywhere",
            put_label(srv, WIDE, "l.png", png_bytes(np.full((400, 512), 7, np.uint8))),
            "inverted",
        ),
        (
            "label in colour",
            put_label(
                srv,
                WIDE,
                "l.png",
                png_bytes(np.dstack([np.zeros((400, 512), np.uint8)] * 2 + [np.full((400, 512), 6, np.uint8)])),
            ),
            "channels differ",
        ),
        ("label tag of 256 bytes", put_label(srv, WIDE, "l.png", label, tag="t" * 256), "names a folder"),
        (
            "batch infer writes final",
            call(
                srv,
                "POST",
                "/batch/infer/xflow",
                params={"run_sync": "true"},
                json={"label_tag": "final", "images": [WIDE]},
            ),
            "final",
        ),
        (
            "info sets a server key",
            call(
                srv,
                "PUT",
                "/datastore/image/info",
                params={"image": WIDE},
                data={"info": json.dumps({"strategy": "boom"})},
            ),
            "server writes",
        ),
        (
            "info sets a score",
            call(
                srv,
                "PUT",
                "/datastore/image/info",
                params={"image": WIDE},
                data={"info": json.dumps({"xflow_uncertainty": "nan"})},
            ),
            "server writes",
        ),
        (
            "upload params set the name",
            put_image(srv, "n.png", png, image="n2", params='{"name": "../x"}'),
            "server writes",
        ),
        (
            "unknown session",
            infer(srv, "xflow", query={"session_id": "no-such-session"}, params={"instruction": "edema"}),
            "unknown or expired session",
        ),
        ("active learning params a list", call(srv, "POST", "/activelearning/xflow_uncertainty", json=[1]), None),
        # instructions that, read word by word, would be answered about another place or finding
        ("a place it does not know", infer(srv, "xflow", WIDE, {"instruction": "effusion in the liver"}), "liver"),
        ("a negated place", infer(srv, "xflow", WIDE, {"instruction": "effusion, not on the left"}), "negated"),
        ("the heart for effusion", infer(srv, "xflow", WIDE, {"instruction": "effusion in the heart"}), "cardiomegaly"),
        (
            "an excluded finding",
            infer(srv, "xflow", WIDE, {"instruction": "all findings except effusion"}),
            "excluding a finding",
        ),
        ("dataset limit 0", call(srv, "GET", "/datastore/dataset", params={"limit_cases": 0}), None),
    ]
    report = []
    for what, r, word in cases:
        report.append(f"{r.status_code} {what}: {r.text[:100]}")
        assert 400 <= r.status_code < 500, (what, r.status_code, r.text[:400])
        if word is not None:
            assert_4xx(r, word, what)
    print("\n" + "\n".join(report))
    assert hashes(srv.studies) == before  # nothing written by a refused request

    # a persistent 500 is impossible: the strategy still answers after the refused info updates
    al = call(srv, "POST", "/activelearning/xflow_uncertainty", json={"client_id": "c1"})
    assert al.status_code == 200 and al.json()["id"] in (WIDE, SQUARE, LINKED)
    # no absolute path in image info or the active-learning answer
    info = call(srv, "GET", "/datastore/image/info", params={"image": WIDE})
    assert info.status_code == 200 and not os.path.isabs(info.json().get("path", ""))
    assert not os.path.isabs(al.json().get("path", ""))
    # load errors name no folder of the server
    junk = infer(srv, "xflow", params={"instruction": "edema"}, files={"file": ("x.nii.gz", gzip.compress(b"x" * 400))})
    assert junk.status_code == 400 and str(srv.server_tmp) not in junk.text and "/" not in junk.json()["detail"]
    # batch infer runs on a CPU-only server (upstream divided by its zero GPUs)
    batch = call(
        srv,
        "POST",
        "/batch/infer/xflow",
        params={"run_sync": "true"},
        json={"images": [SQUARE], "instruction": "edema", "revise": False},
    )
    assert batch.status_code == 200, batch.text[:300]
    assert (srv.studies / "labels" / "original" / f"{SQUARE}.png").is_file()
    assert srv.server.proc.alive()


# --- 2. a label never reads a file it names (class 1) --------------------------------------------


def test_label_files_never_read_a_file_they_name(srv):
    before = hashes(srv.studies)
    answers = {}
    for name, path in (("canary", srv.canary), ("missing", srv.outside / "missing.txt")):
        for skip in ("byte skip: 0\n", "byte skip: 16\n", ""):
            evil = nrrd_file((512, 400), extra=f"data file: {path}\n{skip}")
            answers[(name, skip, "save")] = put_label(srv, WIDE, "l.nrrd", evil)
            answers[(name, skip, "infer")] = infer(
                srv, "xflow_revise", WIDE, {"finding": "edema"}, files={"label": ("l.nrrd", evil)}
            )
        lst = nrrd_file((512, 400), extra=f"data file: LIST\n{path}\n")
        answers[(name, "list", "save")] = put_label(srv, WIDE, "l.nrrd", lst)
    for key, r in answers.items():
        assert_4xx(r, "data file", str(key))
        assert "CANARY" not in r.text and str(srv.outside) not in r.text
    for skip in ("byte skip: 0\n", "byte skip: 16\n", "", "list"):  # no existence leak: same answer for both
        for route in ("save", "infer"):
            if (skip, route) == ("list", "infer"):
                continue
            a, b = answers[("canary", skip, route)], answers[("missing", skip, route)]
            assert (a.status_code, a.text) == (b.status_code, b.text)
    # a NIfTI header/image pair would read a second file: refused from the header
    import nibabel as nib

    pair = nib.Nifti1Header()
    pair.set_data_shape((512, 400))
    pair["magic"] = b"ni1"
    r = put_label(srv, WIDE, "l.nii", pair.binaryblock + b"\0" * 4 + bytes(512 * 400))
    assert_4xx(r, "separate .img file")
    assert srv.canary.stat().st_atime_ns == srv.canary_atime, "the canary was read"
    assert hashes(srv.studies) == before


# --- 3. the content decides the type (class 6) -------------------------------------------------------


def test_uploads_are_typed_by_content_not_by_name(srv):
    polyglot = (
        png_bytes((np.arange(256 * 256).reshape(256, 256) % 253).astype(np.uint8))
        + b"<html><script>alert(document.cookie)</script></html>"
    )
    r = put_image(srv, "poly.html", polyglot)
    assert r.status_code == 200 and r.json()["image"] == "poly"
    assert (srv.studies / "poly.png").is_file() and not list(srv.studies.glob("poly.htm*"))
    got = call(srv, "GET", "/datastore/image", params={"image": "poly"})
    assert got.status_code == 200 and got.headers["content-type"] == "image/png"
    assert got.headers.get("x-content-type-options") == "nosniff"
    html = b"<html><body>hello</body></html>" * 4
    assert_4xx(put_image(srv, "page.png", html), "by its content")
    nrrd_label = nrrd_file((256, 256), data=bytes(256 * 256))
    assert_4xx(put_image(srv, "label.png", nrrd_label), "by its content")  # an NRRD is no radiograph
    ok = put_label(srv, "poly", "drawn.html", nrrd_label)  # a label NRRD, whatever it is called
    assert ok.status_code == 200, ok.text
    assert (srv.studies / "labels" / "final" / "poly.nrrd").is_file()
    assert call(srv, "DELETE", "/datastore/image", params={"id": "poly"}).status_code == 200
    assert not (srv.studies / "poly.png").exists() and not (srv.studies / "labels" / "final" / "poly.nrrd").exists()


# --- 4. compression bombs: refused from the header or decoded with a hard cap (classes 4, 5) --------


def test_compression_bombs_keep_server_memory_bounded(srv):
    before = hashes(srv.studies)
    sizes_10d = nrrd_file((2, 2, 2, 2, 2, 2, 2, 2, 4096, 4096), data=bytes(64))
    gzip_bomb = nrrd_file((512, 400), "gzip", stream_compress(zlib.compressobj(9, zlib.DEFLATED, 31), BOMB_BYTES))
    bzip_bomb = nrrd_file((512, 400), "bzip2", stream_compress(bz2.BZ2Compressor(9), BOMB_BYTES // 2))
    dicom_bomb = deflated_dicom_bomb(BOMB_BYTES)
    far = nifti_far_offset(8 << 20)
    assert max(len(gzip_bomb), len(bzip_bomb), len(dicom_bomb)) < 2 << 20
    pid = srv.server.proc.pid
    rss0, hwm0 = rss_kib(pid)
    peak = [rss0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_kib(pid)[0])
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    blocked = []

    def other_client():  # a good client is answered while the far-offset NIfTI is refused
        t = time.monotonic()
        blocked.append((call(srv, "GET", "/info/").status_code, time.monotonic() - t))

    try:
        results = {
            "NRRD with 10 dimensions": (put_label(srv, WIDE, "l.nrrd", sizes_10d), "pixels"),
            "gzip NRRD label bomb": (put_label(srv, WIDE, "l.nrrd", gzip_bomb), "expands past"),
            "gzip NRRD bomb to infer": (
                infer(srv, "xflow_revise", WIDE, {"finding": "edema"}, files={"label": ("l.nrrd", gzip_bomb)}),
                "expands past",
            ),
            "bzip2 NRRD label bomb": (put_label(srv, WIDE, "l.nrrd", bzip_bomb), "expands past"),
            "NIfTI extension of 1 GiB": (put_label(srv, WIDE, "l.nii.gz", nifti_huge_extension()), "does not fit"),
            "Deflated DICOM bomb": (put_image(srv, "bomb.dcm", dicom_bomb, image="dcmbomb"), "inflates past"),
            "Deflated DICOM bomb to infer": (
                infer(srv, "xflow", params={"instruction": "edema"}, files={"file": ("b.dcm", dicom_bomb)}),
                "inflates past",
            ),
        }
        t0 = time.monotonic()
        th = threading.Thread(target=other_client)
        th.start()
        results["NIfTI vox_offset 2^33"] = (put_image(srv, "far.nii.gz", far, image="far"), "vox_offset")
        far_seconds = time.monotonic() - t0
        th.join(60)
    finally:
        done.set()
        sampler.join()
    rss1, hwm1 = rss_kib(pid)
    report = []
    for what, (r, word) in results.items():
        report.append(f"{r.status_code} {what}: {r.text[:120]}")
        assert_4xx(r, word, what)
    growth = max(peak[0], hwm1) - max(rss0, hwm0)
    print("\n" + "\n".join(report))
    print(
        f"server RSS {rss0 / 1024:.0f} MiB before, sampled peak {peak[0] / 1024:.0f} MiB, high-water mark "
        f"{hwm0 / 1024:.0f} -> {hwm1 / 1024:.0f} MiB across bombs of {BOMB_BYTES >> 20} MiB; "
        f"far-offset NIfTI refused in {far_seconds:.2f} s, /info/ meanwhile in {blocked[0][1]:.2f} s"
    )
    assert peak[0] - rss0 < 192 * 1024, "a bomb expanded in the server's memory"
    assert hwm1 - hwm0 < 192 * 1024
    assert far_seconds < 5 and blocked[0] == (200, blocked[0][1]) and blocked[0][1] < 5
    assert srv.server.proc.alive() and growth < 192 * 1024
    assert hashes(srv.studies) == before  # no bomb stored


# --- 5. ids never name the datastore's folders; deletes never leave it (classes 2, 3) ----------------


def test_ids_never_name_datastore_folders_and_deletes_stay_inside(srv):
    png = (srv.studies / f"{SQUARE}.png").read_bytes()
    human = np.zeros((400, 512), np.uint8)
    human[100:200, 300:400] = 3
    assert put_label(srv, WIDE, "human.png", png_bytes(human)).status_code == 200
    saved = hashes(srv.studies / "labels")
    for name in ("labels", "dicom", "datastore_v2.json", ".lock", "labels.nii.gz"):
        r = put_image(srv, name, png)
        if r.status_code == 200:  # stored as <id>.png beside the folder, never as the folder
            image_id = r.json()["image"]
            assert (srv.studies / f"{image_id}.png").is_file()
            assert call(srv, "DELETE", "/datastore/image", params={"id": image_id}).status_code == 200
        else:
            assert 400 <= r.status_code < 500, (name, r.text)
    for image_id in ("labels", "dicom", "x.png", "a.nii", ".hidden"):
        r = put_image(srv, "x.png", png, image=image_id)
        if r.status_code == 200:
            assert (srv.studies / f"{image_id}.png").is_file()
            call(srv, "DELETE", "/datastore/image", params={"id": image_id})
        else:
            assert_4xx(r, "invalid image id", image_id)
        assert call(srv, "DELETE", "/datastore/image", params={"id": image_id}).status_code == 404
    assert (srv.studies / "labels").is_dir() and hashes(srv.studies / "labels") == saved
    assert (srv.studies / "datastore_v2.json").is_file()
    listing = call(srv, "GET", "/datastore/", params={"output": "all"}).json()
    assert WIDE in json.dumps(listing) and str(srv.studies) not in json.dumps(listing)
    train_list = call(srv, "GET", "/datastore/", params={"output": "train"})  # upstream: absolute paths
    assert train_list.status_code == 200 and f"{WIDE}.png" in train_list.text
    assert str(srv.studies) not in train_list.text
    # deleting a linked image removes the link, never the file outside the datastore
    assert call(srv, "DELETE", "/datastore/image", params={"id": LINKED}).status_code == 200
    assert not os.path.lexists(srv.studies / f"{LINKED}.png")
    assert srv.target.read_bytes() == srv.target_bytes
    assert hashes(srv.studies / "labels") == saved
    # the datastore keeps working after all that: a label can still be read back
    r = call(srv, "GET", "/datastore/label", params={"label": WIDE, "tag": "final"})
    assert r.status_code == 200 and np.array_equal(np.asarray(Image.open(io.BytesIO(r.content))), human)


# --- 6. human labels stay human, re-uploads stay consistent, info stays bounded (class 8) ------------


def test_human_labels_and_image_info_stay_consistent(srv):
    final = srv.studies / "labels" / "final" / f"{WIDE}.png"
    assert final.is_file()  # the person's label of the previous test
    human = final.read_bytes()
    r = call(
        srv,
        "POST",
        "/batch/infer/xflow",
        params={"run_sync": "true"},
        json={"images": [WIDE], "label_tag": "final", "instruction": "edema"},
    )
    assert_4xx(r, "final")
    r = call(
        srv,
        "POST",
        "/batch/infer/xflow",
        params={"run_sync": "true"},
        json={"images": [WIDE], "instruction": "edema", "revise": False},
    )
    assert r.status_code == 200 and final.read_bytes() == human
    assert (srv.studies / "labels" / "original" / f"{WIDE}.png").is_file()
    # a re-upload of another size over a labeled image is refused: the label keeps its image
    other = png_bytes((np.arange(300 * 200).reshape(300, 200) % 251).astype(np.uint8))
    r = put_image(srv, "w.png", other, image=WIDE)
    assert r.status_code == 409 and "has labels" in r.json()["detail"]
    assert final.read_bytes() == human
    assert Image.open(srv.studies / f"{WIDE}.png").size == (512, 400)
    # an unlabeled image may be replaced
    assert put_image(srv, "s.png", other, image="replaceable").status_code == 200
    assert put_image(srv, "s.png", (srv.studies / f"{SQUARE}.png").read_bytes(), image="replaceable").status_code == 200
    assert Image.open(srv.studies / "replaceable.png").size == (384, 384)
    # image info is bounded
    statuses = []
    for k in range(8):
        r = call(
            srv,
            "PUT",
            "/datastore/image/info",
            params={"image": SQUARE},
            data={"info": json.dumps({f"note{k}": "n" * 15000})},
        )
        statuses.append(r.status_code)
    assert statuses[0] == 200 and 413 in statuses, statuses
    info = call(srv, "GET", "/datastore/image/info", params={"image": SQUARE})
    assert len(info.content) <= 64 * 1024 + 1024
    big = call(
        srv, "PUT", "/datastore/image/info", params={"image": SQUARE}, data={"info": json.dumps({"n": "x" * 20000})}
    )
    assert big.status_code == 413


# --- 7. unknown sessions, expired sessions, the last column (class 13) ------------------------------


def test_sessions_and_clicks_on_the_image_edge(srv):
    png = (srv.studies / f"{WIDE}.png").read_bytes()
    r = infer(srv, "xflow", query={"session_id": "nope"}, params={"instruction": "edema"})
    assert r.status_code == 404 and "unknown or expired session" in r.json()["detail"]
    s = call(srv, "PUT", "/session/", params={"expiry": 2}, files={"files": ("w.png", png)})
    assert s.status_code == 200, s.text
    sid = s.json()["session_id"]
    got = call(srv, "GET", f"/session/{sid}")
    assert got.status_code == 200 and str(srv.tmp) not in got.text
    assert str(srv.tmp) not in s.text  # the session's folder is not handed out
    live = infer(srv, "xflow", query={"session_id": sid}, params={"instruction": "edema", "revise": False})
    assert live.status_code == 200, live.text[:300]
    time.sleep(3.5)
    gone = infer(srv, "xflow", query={"session_id": sid}, params={"instruction": "edema"})
    assert gone.status_code == 404 and "expired" in gone.json()["detail"]
    edge = infer(
        srv,
        "xflow_revise",
        WIDE,
        {"finding": "effusion", "foreground": [[511.999, 399.999, 0]]},
        query={"output": "json"},
    )
    assert edge.status_code == 200, edge.text[:300]
    out = infer(srv, "xflow_revise", WIDE, {"finding": "effusion", "foreground": [[512, 10, 0]]})
    assert out.status_code == 422 and "outside" in out.json()["detail"]


# --- 8. bounded background work; concurrency (class 10, item 3) --------------------------------------


def _tasks(srv, kind: str) -> list[dict]:
    r = call(srv, "GET", f"/{kind}/", params={"all": "true"})
    return r.json() if r.status_code == 200 else []


def _wait_idle(srv, kind: str, timeout: float = 300) -> None:  # generous: CI may share its cores
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not [t for t in _tasks(srv, kind) if t["status"] in ("SUBMITTED", "RUNNING")]:
            return
        time.sleep(0.5)
    raise AssertionError(f"{kind} tasks still pending: {_tasks(srv, kind)}")


def test_background_work_is_bounded_and_stoppable(srv):
    ids = []
    for _ in range(4):  # the deprecated run-all route enqueues: at most one run waits
        r = call(srv, "POST", "/scoring/", json={})
        assert r.status_code == 200, r.text
        ids.append(r.json()["xflow_uncertainty"]["result"]["id"])
    assert len(set(ids)) <= 2, ids
    waiting = [t for t in _tasks(srv, "scoring") if t["status"] == "SUBMITTED"]
    assert len(waiting) <= 1
    # train during scoring: accepted; a second train: refused while the first is pending
    first = call(srv, "POST", "/train/xflow", json={"steps": 1})
    assert first.status_code == 200, first.text
    second = call(srv, "POST", "/train/xflow", json={"steps": 1}, params={"enqueue": "true"})
    assert second.status_code == 429 and "already running or queued" in second.json()["detail"]
    stop = call(srv, "DELETE", "/train/")
    assert stop.status_code == 200
    _wait_idle(srv, "train")
    assert not [t for t in _tasks(srv, "train") if t["status"] in ("SUBMITTED", "RUNNING")]
    assert len(_tasks(srv, "train")) == 1  # the refused one was never queued
    call(srv, "DELETE", "/scoring/")
    _wait_idle(srv, "scoring")
    statuses = [t["status"] for t in _tasks(srv, "scoring")]
    assert "SUBMITTED" not in statuses and "RUNNING" not in statuses, statuses


def test_delete_during_infer_loses_nothing(srv):
    png = (srv.studies / f"{SQUARE}.png").read_bytes()
    assert put_image(srv, "v.png", png, image="victim").status_code == 200
    labels = hashes(srv.studies / "labels")
    got = {}

    def run():
        got["infer"] = infer(
            srv, "xflow", "victim", {"instruction": "segment all findings", "revise": True}, query={"output": "json"}
        )

    th = threading.Thread(target=run)
    th.start()
    time.sleep(0.3)
    deleted = call(srv, "DELETE", "/datastore/image", params={"id": "victim"})
    th.join(600)
    assert deleted.status_code == 200
    assert got["infer"].status_code in (200, 404), got["infer"].text[:300]
    assert "victim" not in call(srv, "GET", "/datastore/", params={"output": "all"}).text
    assert hashes(srv.studies / "labels") == labels
    good = infer(srv, "xflow", WIDE, {"instruction": "edema", "revise": False}, query={"output": "json"})
    assert good.status_code == 200


# --- last: temp files, paths in answers -------------------------------------------------------------


def test_a_client_on_the_same_machine_keeps_its_result(srv):
    """MONAI Label's client saves the result under the name the server sent, in its temporary
    folder, and the server deletes its own copy once sent. With both in one temporary folder (a
    client beside the server, as in the README) the server used to delete the client's file."""
    from monailabel.client import MONAILabelClient

    client = MONAILabelClient(srv.url, tmpdir=str(srv.server_tmp))
    saved, answer = client.infer("xflow", WIDE, {"instruction": "edema", "revise": False})
    time.sleep(2.0)  # the server's background removal of what it sent
    try:
        assert os.path.isfile(saved), "the server deleted the client's saved result"
        assert np.asarray(Image.open(saved)).shape == (400, 512) and "edema" in answer["answer"]
    finally:
        if os.path.exists(saved):
            os.unlink(saved)  # the next test counts the files in the server's temporary folder


def test_temp_folder_is_as_clean_as_before_and_no_answer_holds_a_path(srv):
    time.sleep(2.0)  # background removal of sent results
    now = temp_files(srv.server_tmp)
    new = sorted(set(now) - set(srv.temp_baseline))
    assert not new, f"{len(new)} files left in the server's temporary folder: {new[:10]}"
    for what, r in srv.answers:
        text = r.text if "json" in r.headers.get("content-type", "") else ""
        for folder in (str(srv.tmp), str(REPO), str(Path.home())):
            assert folder not in text, (what, text[:300])
    assert len(srv.answers) > 60
    assert srv.server.proc.alive()
