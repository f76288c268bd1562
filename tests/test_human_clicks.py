"""A person's clicks move the mask: the committed demo F_seg through the running MONAI Label server,
sent exactly as 3D Slicer's module and OHIF's panel send clicks (issue 33, the human path).

The annotator is the click benchmark's simulated user
(:func:`~monailabel_xflow.policy.oracle.simulated_user`: the deepest pixel of the larger error of
the segment it sees), clicking on lesions of ``sample-data`` (seed 1, a set no model choice was
made on) that it starts from an empty segment (a finding the auto-segmentation missed, the case
where a person must click). Each click is a new request holding every click so far, as both
clients send them; the segment is what the client makes of the answer.

* Slicer: ``onClickDeepgrow``'s request (``label``, ``foreground``, ``background``, ``slice``, the
  options table), read as the module imports a click answer (``tests/test_slicer_replay.py``).
* OHIF: the point-prompt panel's request (clicks keyed by the finding's name, ``background``,
  the panel's result options), read back from the NRRD it gets.

What is asserted: three clicks raise the lesion's IoU by at least 0.15 on average over the
lesions, and the second and third clicks raise it above the first click's (they correct, not just
place). Not asserted, because the demo F_seg does not do it: that a negative click inside an
over-segmented region removes it (measured in ``reports/click-efficiency/README.md``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import requests
from PIL import Image
from servers import monailabel_server
from test_slicer_replay import SlicerScene, click_index, deepgrow_params, module_infer

from monailabel_xflow.geometry import Click, point_to_pixel
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.policy.oracle import simulated_user
from monailabel_xflow.transforms import labels as label_io
from monailabel_xflow.vocabulary import FINDINGS

pytestmark = pytest.mark.timeout(1500)

SAMPLE = Path(__file__).resolve().parents[1] / "sample-data"
CLICKS = 3
# lesions of sample-data whose finding has one component in the image (the click answer replaces
# the whole segment, so a finding drawn in two places would lose the other one), 0.5 % and up
LESIONS = [
    ("phantom_1_00002", "atelectasis"),
    ("phantom_1_00003", "opacity"),
    ("phantom_1_00004", "effusion"),
    ("phantom_1_00009", "pneumonia"),
    ("phantom_1_00010", "atelectasis"),
    ("phantom_1_00011", "opacity"),
]
PANEL = {"result_extension": ".nrrd", "result_dtype": "uint8", "result_compress": False, "restore_label_idx": False}


def lesion_truth(study: str, finding: str) -> np.ndarray:
    entries = {e["image"]: e for e in json.loads((SAMPLE / "ground-truth" / "phantoms.json").read_text())}
    (lesion,) = [x for x in entries[f"{study}.png"]["lesions"] if x["finding"] == finding]
    return np.asarray(Image.open(SAMPLE / "ground-truth" / "lesion_mask" / lesion["mask"])) > 0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("human-clicks")
    studies = tmp / "studies"
    studies.mkdir()
    for study, _ in LESIONS:
        shutil.copy(SAMPLE / f"{study}.png", studies)
    with monailabel_server(studies, tmp / "server") as running:  # the committed demo models
        client = running.client(tmp)
        yield SimpleNamespace(url=running.url, client=client, info=client.info(), studies=studies, tmp=tmp)


def slicer_answer(server, study: str, finding: str, clicks: list[Click], shape) -> np.ndarray:
    fg = [click_index(*point_to_pixel(c.x, c.y, shape)) for c in clicks if c.positive]
    bg = [click_index(*point_to_pixel(c.x, c.y, shape)) for c in clicks if not c.positive]
    label_file, result = module_infer(
        server.client, "xflow_revise", study, deepgrow_params(server.info, finding, fg, bg)
    )
    assert result["finding"] == finding
    scene = SlicerScene(server.studies / f"{study}.png", server.info["labels"])
    scene.import_click(label_file, [finding])  # labels = [selected segment] (M:1764)
    return scene.segments[finding]


def ohif_answer(server, study: str, finding: str, clicks: list[Click], shape) -> np.ndarray:
    params = dict(server.info["models"]["xflow_revise"]["config"])
    params = {k: v[0] if isinstance(v, list) else v for k, v in params.items()}
    params.update(PANEL)
    params[finding] = [click_index(*point_to_pixel(c.x, c.y, shape)) for c in clicks if c.positive]
    params["background"] = [click_index(*point_to_pixel(c.x, c.y, shape)) for c in clicks if not c.positive]
    r = requests.post(
        f"{server.url}/infer/xflow_revise",
        params={"image": study, "output": "image"},
        data={"params": json.dumps(params)},
        timeout=300,
    )
    assert r.status_code == 200, r.text[:300]
    path = server.tmp / f"ohif-{study}.nrrd"
    path.write_bytes(r.content)
    return label_io.read_label(str(path), shape) == FINDINGS.index(finding) + 1


def session(answer, server, study: str, finding: str) -> list[float]:
    """The annotator's clicks, each a new request with every click so far: IoUs after 0..3 clicks."""
    truth = lesion_truth(study, finding)
    user = simulated_user(CLICKS)
    mask = np.zeros_like(truth)
    clicks: list[Click] = []
    ious = [0.0]
    for _ in range(CLICKS):
        click = user.next_click(mask, truth, clicks)
        if click is None:
            break
        clicks.append(click)
        mask = answer(server, study, finding, clicks, truth.shape)
        ious.append(mask_iou(mask, truth))
    ious += [ious[-1]] * (CLICKS + 1 - len(ious))
    return ious


@pytest.mark.parametrize("client", ["slicer", "ohif"])
def test_three_clicks_raise_the_lesions_iou(server, client):
    answer = slicer_answer if client == "slicer" else ohif_answer
    curves = np.array([session(answer, server, study, finding) for study, finding in LESIONS])
    mean = curves.mean(0)
    print(f"{client}: mean IoU after 0..{CLICKS} clicks", np.round(mean, 3), "per lesion", np.round(curves, 3))
    assert mean[CLICKS] - mean[0] >= 0.15, mean
    assert mean[CLICKS] > mean[1], mean  # the later clicks correct the first click's mask
