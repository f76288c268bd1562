"""Issue 34, item 4: the studies folder and the workspace on a small file system that fills up.

The test mounts a size-limited tmpfs itself (``mount -t tmpfs -o size=...``, root only; skipped
with the reason where mounting is not permitted) and unmounts it at the end. The server's log stays
on the ordinary disk. With the tmpfs full: saving a label and adding an image answer 507 naming the
full disk; the label stored before is unchanged byte for byte, the index still loads and lists it,
no temporary file is left; the server keeps answering. Once space is freed the same save succeeds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import requests
from servers import monailabel_server
from test_hostile_server import SQUARE, WIDE, hostile_setup, png_bytes

from monailabel_xflow.files import TEMP_MARK

pytestmark = pytest.mark.timeout(900)

SIZE = "12m"


@contextlib.contextmanager
def small_filesystem(where: Path):
    where.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0755", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a size-limited tmpfs here ({exc}); the disk-full test needs root")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here ({done.stderr.strip()}); the disk-full test needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=60)


def fill(folder: Path) -> Path:
    """Write a filler file until the file system is full; returns it."""
    filler = folder / "filler.bin"
    chunk = b"\0" * (64 * 1024)
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass
    with contextlib.suppress(OSError), open(folder / "filler2.bin", "wb") as f:
        while True:
            f.write(b"\0" * 512)
            f.flush()
    return filler


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_full_disk_answers_507_damages_nothing_and_recovers(tmp_path, cxr_samples, tiny_models):
    with small_filesystem(tmp_path / "small") as small:
        models, studies_src, _ = hostile_setup(tmp_path, cxr_samples, tiny_models, "unused.png")
        studies = small / "studies"
        studies.mkdir()
        for p in studies_src.iterdir():
            (studies / p.name).write_bytes(p.read_bytes())
        server_tmp = tmp_path / "server"
        server_tmp.mkdir()
        (small / "workspace").mkdir()
        (server_tmp / "workspace").symlink_to(small / "workspace", target_is_directory=True)
        conf = {"models": str(models), "model_dir": str(small / "model")}
        with monailabel_server(studies, server_tmp, conf=conf) as server:
            url = server.url
            first = np.zeros((400, 512), np.uint8)
            first[50:150, 50:150] = 2
            r = requests.put(
                f"{url}/datastore/label",
                params={"image": WIDE, "tag": "final"},
                files={"label": ("l.png", png_bytes(first))},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            stored = studies / "labels" / "final" / f"{WIDE}.png"
            before = sha(stored)
            index_before = (studies / "datastore_v2.json").read_text()

            filler = fill(small)
            second = np.zeros((400, 512), np.uint8)
            second[200:300, 200:380] = 5
            noisy = second + (np.random.default_rng(0).random(second.shape) < 0.3).astype(np.uint8)
            for image, label in ((WIDE, noisy), (SQUARE, noisy[:384, :384])):
                r = requests.put(
                    f"{url}/datastore/label",
                    params={"image": image, "tag": "final"},
                    files={"label": ("l.png", png_bytes(label))},
                    timeout=60,
                )
                assert r.status_code == 507, (image, r.status_code, r.text)
                assert "space" in r.json()["detail"], r.text
            png = (studies / f"{SQUARE}.png").read_bytes()
            r = requests.put(
                f"{url}/datastore/image", params={"image": "added"}, files={"file": ("a.png", png)}, timeout=60
            )
            assert r.status_code == 507 and "space" in r.json()["detail"], r.text
            # nothing stored is damaged, nothing half-written is left, the server still answers
            assert sha(stored) == before
            assert (studies / "datastore_v2.json").read_text() == index_before
            assert not [p for p in small.rglob("*") if TEMP_MARK in p.name]
            assert requests.get(f"{url}/info/", timeout=60).status_code == 200
            listing = requests.get(f"{url}/datastore/", params={"output": "all"}, timeout=60).json()["objects"]
            assert "final" in listing[WIDE]["labels"] and "added" not in listing
            assert "final" not in listing[SQUARE]["labels"]

            # space freed: the same writes succeed
            filler.unlink()
            with contextlib.suppress(OSError):
                os.unlink(small / "filler2.bin")
            r = requests.put(
                f"{url}/datastore/label",
                params={"image": SQUARE, "tag": "final"},
                files={"label": ("l.png", png_bytes(noisy[:384, :384]))},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            r = requests.put(
                f"{url}/datastore/image", params={"image": "added"}, files={"file": ("a.png", png)}, timeout=60
            )
            assert r.status_code == 200, r.text
            index = json.loads((studies / "datastore_v2.json").read_text())["objects"]
            assert "final" in index[SQUARE]["labels"] and "added" in index
            assert sha(stored) == before
