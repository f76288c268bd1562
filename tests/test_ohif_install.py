"""``xflow ohif --install``: the pinned OHIF comes from npm and must hash to the pinned integrity.

The real install is ``make ohif`` (``.ci/run`` runs it; ``tests/test_ohif_current.py`` uses what
it installed). Here ``npm`` on PATH is a small script that packs a tarball of our own, as
``npm pack`` would: a tarball that is not the pinned release is refused and nothing is installed.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile

import pytest

from monailabel_xflow.commands import ohif


def fake_npm(folder, payload: bytes) -> None:
    """An ``npm`` whose ``pack`` writes ``package/dist/index.html`` = ``payload`` as a .tgz into
    ``--pack-destination``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("package/dist/index.html")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    (folder / "release.tgz").write_bytes(buf.getvalue())
    script = folder / "npm"
    script.write_text(f'#!/bin/sh\n[ "$1" = pack ] || exit 3\ncp "{folder}/release.tgz" "$4/ohif-app-x.tgz"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_a_tarball_that_is_not_the_pinned_release_is_refused(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_npm(bin_dir, b"<html>not OHIF</html>")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(RuntimeError, match="is not the pinned sha512-"):
        ohif.install(tmp_path / "ohif")
    assert not (tmp_path / "ohif").exists()


def test_without_npm_the_install_says_what_is_missing(tmp_path, monkeypatch, capsys):
    from monailabel_xflow.cli import main

    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    assert main(["ohif", "--install", "--dir", str(tmp_path / "ohif")]) == 2
    assert "npm is not installed" in capsys.readouterr().err


def test_an_installed_viewer_is_kept_and_its_config_is_ours(tmp_path):
    dist = ohif.dist_dir(tmp_path)
    dist.mkdir(parents=True)
    (dist / "index.html").write_text("<html></html>")
    assert ohif.install(tmp_path) == dist  # idempotent: npm is not called
    config = ohif.app_config("bitmap")
    assert '"defaultMode": "bitmap"' in config and "window.location.origin + '/dicom-web'" in config
    with pytest.raises(ValueError, match="seg_encoding"):
        ohif.app_config("png")
