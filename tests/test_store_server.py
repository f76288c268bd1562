"""The workspace store against a running MONAI Label server (the committed demo model): Next
Sample's work done ahead, answers kept across a restart byte for byte, a click with no encode,
and the scoring subprocess's work served by the server."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import requests
from servers import monailabel_server
from test_slicer_replay import module_infer, module_params

pytestmark = pytest.mark.timeout(1500)

SAMPLES = Path(__file__).resolve().parents[1] / "sample-data"
IMAGES = ["phantom_1_00001", "phantom_1_00002", "phantom_1_00003"]
ENCODING = "SAM3: encoding"  # the segmenter's log line before each encode


def answers_in(store: Path) -> int:
    return len(list(store.rglob("ans/*/*")))


def test_work_kept_in_the_workspace_serves_next_sample_clicks_and_a_restarted_server(tmp_path):
    studies = tmp_path / "studies"
    studies.mkdir()
    for name in IMAGES:
        shutil.copy(SAMPLES / f"{name}.png", studies)
    server_tmp = tmp_path / "server"
    store = server_tmp / "workspace" / "store"
    conf = {"store_mb": "256"}

    with monailabel_server(studies, server_tmp, conf=conf) as server:
        client = server.client(tmp_path)
        info = client.info()
        slicer = module_params(info, "infer", "xflow")  # Next Sample's auto-run: Stage 1, all findings
        assert slicer["revise"] == "false" and slicer["finding"] == ""

        # Next Sample: the image handed out is encoded and answered in the background
        sample = client.next_sample("xflow_uncertainty", {})
        deadline = time.monotonic() + 300
        while answers_in(store) == 0 and time.monotonic() < deadline:
            time.sleep(1)
        assert answers_in(store) >= 1, server.proc.tail()
        _, result = module_infer(client, "xflow", sample["id"], slicer)
        assert all(t.get("stored") for t in result["traces"]), "the auto-run was not answered from the store"

        # a fresh answer with Stage 2 on another image, written to the store as it is returned
        other = next(i for i in IMAGES if i != sample["id"])
        fresh_file, fresh = module_infer(client, "xflow", other, {**slicer, "revise": "true", "max_clicks": 2})
        assert not any(t.get("stored") for t in fresh["traces"])
        fresh_bytes = Path(fresh_file).read_bytes()
        assert ENCODING in server.proc.tail(1_000_000)  # the log shows encodes (so their absence below means it)

    with monailabel_server(studies, server_tmp, conf=conf) as server:  # a restart: nothing in memory
        client = server.client(tmp_path)
        again_file, again = module_infer(client, "xflow", other, {**slicer, "revise": "true", "max_clicks": 2})
        assert all(t.get("stored") for t in again["traces"])
        assert Path(again_file).read_bytes() == fresh_bytes  # the label file, byte for byte
        assert again["answer"] == fresh["answer"] and again["findings"] == fresh["findings"]
        # its Stage 1 only answers were kept on the way: the auto-run on it is stored too
        _, auto = module_infer(client, "xflow", other, slicer)
        assert all(t.get("stored") for t in auto["traces"])
        # a click on a stored image: no encode
        label, params = client.infer("xflow_revise", other, {"finding": "effusion", "foreground": [[200, 300, 0]]})
        assert params["pixels"] >= 0 and Path(label).is_file()
        assert ENCODING not in server.proc.tail(1_000_000)

        # the scoring subprocess fills the store the server reads
        third = next(i for i in IMAGES if i not in (sample["id"], other))
        r = requests.post(
            f"{server.url}/scoring/xflow_uncertainty",
            params={"run_sync": "true"},
            json={"images": [third], "max_clicks": 1},
            timeout=900,
        )
        assert r.status_code == 200, r.text
        assert r.json()["scores"].keys() == {third}
        _, scored = module_infer(client, "xflow", third, slicer)
        assert all(t.get("stored") for t in scored["traces"])
        encodes = server.proc.tail(1_000_000).count(ENCODING)  # the subprocess's own, if its log is here
        client.infer("xflow_revise", third, {"finding": "effusion", "foreground": [[200, 300, 0]]})
        assert server.proc.tail(1_000_000).count(ENCODING) == encodes  # its encode served the click
