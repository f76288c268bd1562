"""Real servers for the app tests: MONAI Label (with the XFlow app) and Orthanc (a PACS).

Both run as child processes on 127.0.0.1, on free ports, with their state in temporary
folders; both are stopped by process id (SIGTERM to the process group the helper created,
SIGKILL after a grace period). Nothing here is a test; tests use these through fixtures.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
ORTHANC_PLUGIN = Path("/usr/share/orthanc/plugins/libOrthancDicomWeb.so")


def free_port() -> int:
    """A TCP port nobody listens on right now (bind to port 0 and release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ORTHANC_APT = "apt-get install -y orthanc orthanc-dicomweb"
"""The Debian packages the PACS tests need (``.ci/run`` installs them)."""


def orthanc_binary() -> str | None:
    """``/usr/sbin/Orthanc`` or ``Orthanc`` on PATH; None when Orthanc or its DICOMweb plugin is
    not installed (the PACS tests then skip, their reason naming :data:`ORTHANC_APT`).

    Raises:
        RuntimeError: one is missing and ``XFLOW_REQUIRE_ORTHANC=1`` (set by ``.ci/run``), so CI
            can never skip the PACS tests silently.
    """
    binary = "/usr/sbin/Orthanc" if Path("/usr/sbin/Orthanc").is_file() else shutil.which("Orthanc")
    if binary and ORTHANC_PLUGIN.is_file():
        return binary
    if os.environ.get("XFLOW_REQUIRE_ORTHANC") == "1":
        missing = "Orthanc" if not binary else f"its DICOMweb plugin ({ORTHANC_PLUGIN})"
        raise RuntimeError(f"XFLOW_REQUIRE_ORTHANC=1 but {missing} is not installed ({ORTHANC_APT})")
    return None


class ServerProcess:
    """A child process in its own process group, with its output in a log file."""

    def __init__(self, cmd: Sequence[str], log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None):
        self.log = log
        self._fh = open(log, "wb")  # noqa: SIM115 - the child writes to it until stop() closes it
        self.proc = subprocess.Popen(
            list(cmd),
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            env=dict(env or os.environ),
            cwd=str(cwd) if cwd else None,
            start_new_session=True,
        )
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_http(self, url: str, timeout: float, ok=lambda r: r.status_code == 200) -> float:
        """Poll ``url`` until ``ok(response)``; returns the seconds it took.

        Raises:
            RuntimeError: the process died or the timeout passed (with the log's tail).
        """
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if not self.alive():
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if ok(requests.get(url, timeout=5)):
                    return time.monotonic() - start
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{url} not ready after {timeout:.0f} s:\n{self.tail()}")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the process group this helper started (the server and e.g. its train
        subprocess), SIGKILL after ``grace`` seconds."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait(10)
        else:  # reap children left in its group, if any
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        self._fh.close()


# --- models -------------------------------------------------------------------------------------


def build_tiny_models(folder: Path, seed: int = 0) -> Path:
    """Build a random tiny VLM (base + init/rev adapters) in ``folder/vlm`` and a tiny SAM3
    tracker in ``folder/sam3``, and write the ``models.yaml`` naming them. Returns the YAML path.

    For scripts outside pytest (``benchmarks/``); tests use the ``tiny_models`` fixture, which
    links the session's models instead of building new ones.
    """
    from monailabel_xflow.policy.configs import build_random_vlm
    from monailabel_xflow.segmenter.configs import build_random_sam3

    folder.mkdir(parents=True, exist_ok=True)
    build_random_vlm(folder / "vlm", "tiny", seed=seed, adapters=True)
    build_random_sam3(folder / "sam3", "tiny", seed=seed)
    return write_models_yaml(folder)


def write_models_yaml(folder: Path) -> Path:
    """Write ``folder/models.yaml`` naming the tiny models in ``folder/vlm`` (base + init/rev
    adapters) and ``folder/sam3`` by relative paths, as users write it. Returns the YAML path.
    The ``tiny_models`` fixture (conftest.py) puts the session's tiny models there."""
    cfg = folder / "models.yaml"
    cfg.write_text(
        "vlm_base: ./vlm/base\n"
        "init_adapter: ./vlm/init\n"
        "rev_adapter: ./vlm/rev\n"
        "segmenter: ./sam3\n"
        "device: cpu\n"
        "max_clicks: 2\n"
    )
    return cfg


# --- MONAI Label --------------------------------------------------------------------------------


def monailabel_env(tmp: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus test isolation: caches and sessions in ``tmp``, no
    automatic scoring after every request (tests run it explicitly), no XFLOW_* leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XFLOW_")}
    env.update(
        {
            "MONAI_LABEL_DICOMWEB_CACHE_PATH": str(tmp / "dicomweb-cache"),
            "MONAI_LABEL_DICOMWEB_CACHE_EXPIRY": "1",
            "MONAI_LABEL_SESSION_PATH": str(tmp / "sessions"),
            "MONAI_LABEL_AUTO_UPDATE_SCORING": "false",
            "MONAI_LABEL_DATASTORE_AUTO_RELOAD": "false",
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "2"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


@contextlib.contextmanager
def monailabel_server(
    studies: str | Path,
    tmp: Path,
    conf: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 240.0,
) -> Iterator[RunningServer]:
    """Start ``python -m monailabel.main start_server --app WORKSPACE ...`` and yield it ready.

    The workspace is ``tmp/workspace`` (``xflow serve``'s pointer to the packaged app, the
    server's ``logs/``); trained models go to ``tmp/model``."""
    from monailabel_xflow.commands.serve import prepare_workspace, server_command

    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    workspace = prepare_workspace(tmp / "workspace")
    conf = {"model_dir": str(tmp / "model"), **(conf or {})}
    cmd = server_command(str(workspace), str(studies), "127.0.0.1", port, list(conf.items()), python=sys.executable)
    proc = ServerProcess(cmd, tmp / "monailabel.log", env=monailabel_env(tmp, env), cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        seconds = proc.wait_http(f"{url}/info/", timeout)
        yield RunningServer(url, proc, seconds)
    finally:
        proc.stop()


class RunningServer:
    def __init__(self, url: str, proc: ServerProcess, start_seconds: float):
        self.url = url
        self.proc = proc
        self.start_seconds = start_seconds

    def client(self, tmpdir: Path | None = None):
        from monailabel.client import MONAILabelClient

        return MONAILabelClient(self.url, tmpdir=str(tmpdir) if tmpdir else None)


# --- Orthanc ------------------------------------------------------------------------------------


@contextlib.contextmanager
def orthanc_server(tmp: Path, timeout: float = 60.0, port: int | None = None) -> Iterator[str]:
    """Start Orthanc with its DICOMweb plugin on loopback; yields its base URL
    (``http://127.0.0.1:PORT``; DICOMweb at ``/dicom-web``). ``port`` and ``tmp`` again restart
    the same PACS (its storage is in ``tmp``) where clients expect it."""
    binary = orthanc_binary()
    if binary is None:
        raise RuntimeError(f"Orthanc or its DICOMweb plugin is not installed ({ORTHANC_APT})")
    port = port or free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    config = {
        "Name": "xflow-test",
        "StorageDirectory": str(tmp / "storage"),
        "IndexDirectory": str(tmp / "index"),
        "HttpPort": port,
        "DicomServerEnabled": False,
        "RemoteAccessAllowed": False,
        "AuthenticationEnabled": False,
        "Plugins": [str(ORTHANC_PLUGIN)],
        "DicomWeb": {"Enable": True, "Root": "/dicom-web/", "Host": f"127.0.0.1:{port}"},
    }
    cfg = tmp / "orthanc.json"
    cfg.write_text(json.dumps(config, indent=1))
    proc = ServerProcess([binary, str(cfg)], tmp / "orthanc.log")
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(f"{url}/system", timeout)
        yield url
    finally:
        proc.stop()


def orthanc_upload(url: str, dicom: Path) -> dict:
    """POST one DICOM file to Orthanc's REST API (``/instances``); returns Orthanc's answer."""
    r = requests.post(
        f"{url}/instances", data=dicom.read_bytes(), headers={"Content-Type": "application/dicom"}, timeout=30
    )
    r.raise_for_status()
    return r.json()
