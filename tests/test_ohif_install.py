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


def test_the_default_folder_is_the_checkouts_ohif_then_the_per_user_one(tmp_path, monkeypatch):
    from pathlib import Path

    from monailabel_xflow import commands

    repo = Path(__file__).resolve().parents[1]
    assert commands.checkout_root() == repo  # the tests run from the checkout
    assert ohif.default_dir({}) == repo / ".ohif"  # where `make ohif` installs it
    assert ohif.default_dir({"XFLOW_OHIF_DIR": str(tmp_path / "mine")}) == tmp_path / "mine"
    monkeypatch.setattr(ohif, "checkout_root", lambda: None)  # as from an installed wheel
    assert ohif.default_dir({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "monailabel-xflow" / "ohif"


def test_xflow_ohif_from_another_folder_finds_the_viewer_make_ohif_installed(tmp_path):
    """README step 4 word for word (no XFLOW_OHIF_DIR, run outside the checkout): it serves the
    checkout's ``.ohif/`` when ``make ohif`` installed it there, and otherwise says it looked there."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "XFLOW_OHIF_DIR"}
    cmd = [sys.executable, "-m", "monailabel_xflow.cli", "ohif", "--studies", "http://127.0.0.1:9/dicom-web"]
    proc = subprocess.Popen(
        [*cmd, "--port", "0"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        first = proc.stdout.readline()  # "OHIF 3.13.2 at http://..." once serving; "" when it exits
        if not first:
            assert proc.wait(timeout=60) == 2
            assert f"no OHIF {ohif.OHIF_VERSION} at {repo / '.ohif' / ohif.OHIF_VERSION / 'dist'}" in proc.stderr.read()
        else:
            assert first.startswith(f"OHIF {ohif.OHIF_VERSION} at http://127.0.0.1:")
            assert (ohif.dist_dir(repo / ".ohif") / "index.html").is_file()
    finally:
        if proc.poll() is None:
            # Ctrl-C, unless this run inherited SIGINT ignored (a background job of a shell
            # without job control): the child ignores it too, so stop it by pid with SIGTERM
            ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            proc.send_signal(signal.SIGTERM if ignored else signal.SIGINT)
            proc.wait(timeout=30)
