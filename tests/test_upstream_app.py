"""Upstream's own command serves the same app as ``xflow serve``.

``monailabel start_server --app apps/xflow --studies sample-data --host 127.0.0.1`` (MONAI Label's
``monailabel`` launcher, run as a user runs it, from a folder holding the repository's
``apps/xflow/`` and ``sample-data/``) and ``xflow serve``'s server (``tests/servers.py``: its
workspace pointer, the same ``python -m monailabel.main start_server``) start side by side on free
loopback ports with the same tiny models and the same three phantoms. Both must list the same
tasks, answer 3D Slicer's and OHIF's requests identically, and refuse hostile requests with the
same guard, and upstream's server must keep what it writes in the app folder; both are stopped by
process id.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import requests
from servers import ServerProcess, free_port, monailabel_env, monailabel_server
from test_slicer_replay import module_infer, module_params, pick

from monailabel_xflow.transforms import labels as label_io

pytestmark = pytest.mark.timeout(1200)

REPO = Path(__file__).resolve().parents[1]
STUDIES = ["phantom_1_00005", "phantom_1_00006", "phantom_1_00007"]
IMAGE = "phantom_1_00006"
WRITTEN = ("model", "lib", "logs", "bin", "cache", "store", "__pycache__")
"""What a server writes into its app folder (git-ignored in ``apps/xflow/.gitignore``)."""


def launcher(tmp: Path) -> Path:
    """MONAI Label's ``monailabel`` shell launcher beside this interpreter (``bin/monailabel``).

    The launcher prepends its ``bin/../..`` to PYTHONPATH: the checkout itself for the ``.venv``
    that ``make setup`` makes there, but another checkout for a virtual environment shared by
    several (git worktrees), whose package would then shadow the code under test. In that case the
    same script runs from a copy in ``tmp/venv/bin``, whose ``../..`` holds no package."""
    script = Path(sys.executable).parent / "monailabel"
    assert script.is_file(), f"MONAI Label's launcher is not installed beside {sys.executable}"
    home = script.resolve().parent.parent.parent
    if home == REPO or not (home / "monailabel_xflow").exists():
        return script
    copy = tmp / "venv" / "bin" / "monailabel"
    copy.parent.mkdir(parents=True)
    shutil.copy2(script, copy)
    return copy


def studies_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name in STUDIES:
        shutil.copy(REPO / "sample-data" / f"{name}.png", folder)
    return folder


@pytest.fixture(scope="module")
def both(tmp_path_factory, tiny_models):
    tmp = tmp_path_factory.mktemp("upstream")
    models = tiny_models(tmp / "models")
    # a user's folder: the repository's app folder and a copy of three sample-data phantoms
    user = tmp / "user"
    shutil.copytree(REPO / "apps" / "xflow", user / "apps" / "xflow", ignore=shutil.ignore_patterns(*WRITTEN))
    studies_folder(user / "sample-data")
    env = monailabel_env(tmp / "upstream-env")
    for key in ("MONAI_LABEL_DICOMWEB_CACHE_PATH", "MONAI_LABEL_DICOMWEB_CACHE_EXPIRY", "MONAI_LABEL_SESSION_PATH"):
        env.pop(key)  # the app's own defaults are under test
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # as `activate` does
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    port = free_port()
    cmd = [str(launcher(tmp)), "start_server", "--app", "apps/xflow", "--studies", "sample-data"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--conf", "models_file", str(models)]
    upstream = ServerProcess(cmd, tmp / "upstream.log", env=env, cwd=user)
    try:
        serve_studies = studies_folder(tmp / "studies")
        with monailabel_server(serve_studies, tmp / "serve", conf={"models_file": str(models)}) as ref:
            url = f"http://127.0.0.1:{port}"
            upstream.wait_http(f"{url}/info/", 240)
            yield SimpleNamespace(upstream=url, serve=ref.url, proc=upstream, app=user / "apps" / "xflow", tmp=tmp)
    finally:
        upstream.stop()


def info(url: str) -> dict:
    r = requests.get(f"{url}/info/", timeout=60)
    r.raise_for_status()
    return r.json()


def test_upstream_command_lists_the_same_tasks_and_models(both):
    up, ref = info(both.upstream), info(both.serve)
    assert up["name"] == "XFlow" and up["version"] == ref["version"]
    for key in ("models", "trainers", "strategies", "scoring", "labels", "xflow_models", "rosalia_models"):
        assert up[key] == ref[key], key
    assert set(up["models"]) == {"xflow", "xflow_revise", "rosalia"} and up["xflow_models"]["loaded"]
    assert up["datastore"]["total"] == ref["datastore"]["total"] == len(STUDIES)


def test_upstream_server_writes_into_the_app_folder_with_the_apps_settings(both):
    log = both.app / "logs" / "app.log"
    assert log.is_file() and "MONAI Label settings for radiographs" in log.read_text()
    assert f"MONAI_LABEL_SESSION_PATH={both.app.resolve() / 'cache' / 'sessions'}" in log.read_text()
    assert "MONAI_LABEL_DICOMWEB_CACHE_EXPIRY=10" in log.read_text()
    assert {p.name for p in both.app.iterdir()} <= {"main.py", "README.md", ".gitignore", *WRITTEN}
    assert (both.app / "main.py").read_text() == (REPO / "apps" / "xflow" / "main.py").read_text()  # never rewritten


def answered(url: str, slicer_info: dict, finding: str, tmp: Path):
    from monailabel.client import MONAILabelClient

    info_copy = json.loads(json.dumps(slicer_info))
    pick(info_copy, "xflow", "finding", finding)
    client = MONAILabelClient(url, tmpdir=str(tmp))
    return module_infer(client, "xflow", IMAGE, module_params(info_copy, "infer", "xflow"))


VOLATILE = re.compile(r"time|timing|second|latenc|duration|elapsed|^created$|^file$|^label$")
"""Keys of an answer that differ from run to run (timings, when a trace was written, the server's
temporary files)."""


def comparable(value):
    """An answer's params without :data:`VOLATILE` keys, at any depth."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if not VOLATILE.search(str(k))}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def differences(a, b, path: str = "") -> list[str]:
    """Where two JSON answers differ, as ``path: a != b`` lines (for the failure message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r:.200} != {b!r:.200}"]


def test_slicer_auto_segmentation_is_answered_the_same(both):
    """3D Slicer's exact request (the module's options, a finding picked, NRRD uint8)."""
    slicer_info = info(both.upstream)
    up_file, up = answered(both.upstream, slicer_info, "effusion", both.tmp)
    ref_file, ref = answered(both.serve, slicer_info, "effusion", both.tmp)
    assert differences(comparable(up), comparable(ref)) == [] and up["label_names"] == {"effusion": 1}
    shape = np.asarray(label_io.read_label(ref_file, None)).shape
    np.testing.assert_array_equal(label_io.read_label(up_file, shape), label_io.read_label(ref_file, shape))
    assert label_io.answer_of_file(up_file) == label_io.answer_of_file(ref_file) == up["answer"]


def test_ohif_panel_auto_segmentation_is_answered_the_same(both):
    """OHIF's MONAI Label panel: the options as /info lists them (a finding picked in its options
    table, to keep the run short) plus its format keys, ``output=image`` (only the file comes
    back), multipart form."""
    options = {**info(both.upstream)["models"]["xflow"]["config"], "finding": "effusion"}
    panel = {"result_extension": ".nrrd", "result_dtype": "uint8", "result_compress": False, "restore_label_idx": False}
    bodies = []
    for url in (both.upstream, both.serve):
        r = requests.post(
            f"{url}/infer/xflow",
            params={"image": IMAGE, "output": "image"},
            files={"params": (None, json.dumps({**options, **panel}))},
            timeout=600,
        )
        assert r.status_code == 200, r.text
        path = both.tmp / f"ohif-{len(bodies)}.nrrd"
        path.write_bytes(r.content)
        bodies.append(path)
    shape = np.asarray(label_io.read_label(bodies[1], None)).shape
    np.testing.assert_array_equal(label_io.read_label(bodies[0], shape), label_io.read_label(bodies[1], shape))
    assert label_io.answer_of_file(str(bodies[0])) == label_io.answer_of_file(str(bodies[1]))


@pytest.mark.parametrize(
    "method, path, kwargs, status",
    [
        ("GET", "/datastore/image", {"params": {"image": "../../../etc/passwd"}}, 400),  # ids never name a path
        ("POST", "/infer/xflow", {"params": {"image": IMAGE}, "data": {"params": '{"image": "/etc/passwd"}'}}, 422),
        ("GET", "/logs/", {}, 403),  # closed without authentication
        ("PUT", "/datastore/image", {"files": {"file": ("x.png", b"<html><script>x</script></html>")}}, 400),
        ("POST", "/train/", {"json": {}}, 405),  # the deprecated all-models route
    ],
)
def test_the_guard_refuses_hostile_requests_the_same(both, method, path, kwargs, status):
    answers = [requests.request(method, f"{url}{path}", timeout=120, **kwargs) for url in (both.upstream, both.serve)]
    assert [a.status_code for a in answers] == [status, status], [a.text for a in answers]
    assert answers[0].json() == answers[1].json()
    assert answers[0].headers.get("X-Content-Type-Options") == answers[1].headers.get("X-Content-Type-Options")
