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
place); then a background click at the deepest pixel of the answer's largest spill (the largest
connected region outside the lesion) clears that pixel on every lesion, removes at least half of
that region on average, and does not lower the IoU on average. The demo serves F_seg with its
click refinement (``click_refinement: brs`` in its models file, ``segmenter/refine.py``); without
it, the same weights cleared the clicked pixel on none of these lesions
(``reports/click-efficiency/README.md``).
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


def session(answer, server, study: str, finding: str) -> tuple[list[float], list[Click], np.ndarray]:
    """The annotator's clicks, each a new request with every click so far: IoUs after 0..3 clicks,
    the clicks and the last answer."""
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
    return ious, clicks, mask


@pytest.fixture(scope="module", params=["slicer", "ohif"])
def sessions(request, server):
    answer = slicer_answer if request.param == "slicer" else ohif_answer
    return request.param, answer, [session(answer, server, study, finding) for study, finding in LESIONS]


def test_three_clicks_raise_the_lesions_iou(sessions):
    client, _, runs = sessions
    curves = np.array([ious for ious, _, _ in runs])
    mean = curves.mean(0)
    print(f"{client}: mean IoU after 0..{CLICKS} clicks", np.round(mean, 3), "per lesion", np.round(curves, 3))
    assert mean[CLICKS] - mean[0] >= 0.15, mean
    assert mean[CLICKS] > mean[1], mean  # the later clicks correct the first click's mask


def test_a_background_click_removes_the_spill_it_lands_in(server, sessions):
    from scipy.ndimage import distance_transform_edt
    from scipy.ndimage import label as connected

    client, answer, runs = sessions
    left, before, after = [], [], []
    for (study, finding), (_, clicks, mask) in zip(LESIONS, runs, strict=True):
        truth = lesion_truth(study, finding)
        regions, count = connected(mask & ~truth)
        if not count:
            continue
        spill = regions == 1 + int(np.argmax(np.bincount(regions.ravel())[1:]))
        if spill.sum() < 20:
            continue
        r, c = np.unravel_index(int(np.argmax(distance_transform_edt(spill))), spill.shape)
        background = Click(False, (c + 0.5) / spill.shape[1], (r + 0.5) / spill.shape[0])
        revised = answer(server, study, finding, [*clicks, background], truth.shape)
        assert not revised[r, c], f"{client} {study} {finding}: the background click's pixel is still segmented"
        left.append((revised & spill).sum() / spill.sum())
        before.append(mask_iou(mask, truth))
        after.append(mask_iou(revised, truth))
    print(f"{client}: share of the spill left {np.round(left, 2)}; IoU {np.round(before, 3)} -> {np.round(after, 3)}")
    assert len(left) >= 4, "too few lesions with a spill to judge"
    assert np.mean(left) <= 0.5, left
    assert np.mean(after) >= np.mean(before) - 0.01, (before, after)
