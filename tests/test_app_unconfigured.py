"""The XFlow app started without any model configuration: it serves, and says what is missing."""

from __future__ import annotations

import json
import shutil

import pytest
import requests
from servers import monailabel_server

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def server(tmp_path_factory, cxr_samples):
    tmp = tmp_path_factory.mktemp("unconfigured")
    studies = tmp / "studies"
    studies.mkdir()
    shutil.copy(cxr_samples / "nih" / "images" / "00001933_000.png", studies)
    with monailabel_server(studies, tmp / "server", env={"XFLOW_NO_DEMO": "1"}) as running:
        yield running


def test_info_says_no_weights_are_configured_and_how_to(server):
    info = requests.get(f"{server.url}/info/", timeout=30).json()
    status = info["xflow_models"]
    assert status["configured"] is False
    assert "No XFlow weights are configured" in status["message"] and "--conf models" in status["message"]
    assert "XFLOW_MODELS" in status["message"]
    assert "xflow" in info["models"] and "NOT CONFIGURED" in info["models"]["xflow"]["description"]


def test_requests_answer_503_with_the_message_and_bad_input_still_422(server):
    def infer(model, params):
        return requests.post(
            f"{server.url}/infer/{model}",
            params={"image": "00001933_000"},
            data={"params": json.dumps(params)},
            timeout=60,
        )

    for model, params in (
        ("xflow", {"instruction": "effusion"}),
        ("xflow_revise", {"finding": "edema", "foreground": [[10, 10, 0]]}),
    ):
        r = infer(model, params)
        assert r.status_code == 503 and "No XFlow weights are configured" in r.json()["detail"]
    r = infer("xflow", {"instruction": "segment the pneumothorax"})
    assert r.status_code == 422 and "pneumothorax" in r.json()["detail"]
    assert requests.get(f"{server.url}/info/", timeout=30).status_code == 200
