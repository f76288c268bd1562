"""The XFlow app in a real MONAI Label server, driven by the client Slicer uses.

One server per module (``python -m monailabel.main start_server --app WORKSPACE``) on a
temporary studies folder of real NIH radiographs (one cropped to 1024 x 800 so rows and columns
differ, one RGBA), with random tiny models. Random policies call every finding absent, so mask
contents are checked where they are predictable: the click revision, whose masks come from the
segmenter alone and are compared with the same segmenter run in this process.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import requests
from PIL import Image
from servers import monailabel_server

pytestmark = pytest.mark.timeout(1200)

WIDE = "wide_00000129"  # 1024 wide, 800 high
IMAGES = ["00001369_000", "00001933_000", "00004296_000"]  # 00001369 is RGBA


@pytest.fixture(scope="module")
def app(tmp_path_factory, cxr_samples, tiny_models):
    tmp = tmp_path_factory.mktemp("app_server")
    models = tiny_models(tmp / "models")
    studies = tmp / "studies"
    studies.mkdir()
    for name in IMAGES:
        shutil.copy(cxr_samples / "nih" / "images" / f"{name}.png", studies)
    Image.open(cxr_samples / "nih" / "images" / "00000129_000.png").crop((0, 0, 1024, 800)).save(
        studies / f"{WIDE}.png"
    )
    with monailabel_server(studies, tmp / "server", conf={"models": str(models)}) as server:
        yield SimpleNamespace(
            server=server, url=server.url, studies=studies, models=models, tmp=tmp, client=server.client(tmp)
        )


def expected_revision(app, image_id: str, clicks):
    """The segmenter's answer to the same clicks, computed here from the same weights."""
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.transforms.loading import load_cxr
    from monailabel_xflow.workflow.xflow import XFlow

    if not hasattr(app, "flow"):
        app.flow = XFlow(None, None, load_segmenter(str(app.models.parent / "sam3"), device="cpu"))
    image, _ = load_cxr(app.studies / f"{image_id}.png")
    return app.flow.revise(image, clicks).mask


def client_clicks(shape, foreground, background):
    from monailabel_xflow.geometry import Click, client_index_to_point

    return [Click(True, *client_index_to_point(p, shape)) for p in foreground] + [
        Click(False, *client_index_to_point(p, shape)) for p in background
    ]


def test_info_lists_the_tasks_and_the_models(app):
    info = app.client.info()
    xflow, revise = info["models"]["xflow"], info["models"]["xflow_revise"]
    assert xflow["type"] == "segmentation" and xflow["dimension"] == 2 and xflow["labels"]["effusion"] == 7
    assert {"instruction", "finding", "location", "max_clicks", "revise", "overlay"} <= set(xflow["config"])
    assert revise["type"] == "deepedit"
    assert "xflow" in info["trainers"] and "xflow_uncertainty" in info["strategies"]
    assert "xflow_uncertainty" in info["scoring"]
    assert info["xflow_models"]["configured"] and info["xflow_models"]["loaded"]
    assert info["xflow_models"]["models"]["segmenter"] == "./sam3"
    assert info["datastore"]["total"] == 4
    log = app.server.proc.log.read_text()
    assert "XFlow models in use: vlm_base=./vlm/base" in log  # the log names the models


def test_infer_answers_in_words_with_a_label_of_the_image_size(app):
    label, params = app.client.infer("xflow", WIDE, {"instruction": "is there fluid on the left?", "revise": False})
    record = params["findings"][0]
    assert record["instruction"] == "Segment the effusion in the left lung." and record["label_value"] == 7
    if record["present"]:
        assert record["pixels"] > 0 and params["answer"].startswith("Segmented the effusion")
    else:
        assert params["answer"] == "There is no effusion in the left lung." and params["empty"]
    assert params["traces"][0]["instruction"]["finding"] == "effusion"
    with Image.open(label) as img:
        assert img.size == (1024, 800)  # W x H of the image
        values = set(np.unique(np.asarray(img)).tolist())
    assert values <= {0, 7} and (7 in values) == record["present"]


def test_revise_with_clicks_matches_the_segmenter_in_this_process(app):
    fg, bg = [[700, 300, 0]], [[200, 600, 0]]
    label, params = app.client.infer("xflow_revise", WIDE, {"finding": "effusion", "foreground": fg, "background": bg})
    with Image.open(label) as img:
        got = np.asarray(img)  # (H, W) rows as PIL holds them
    assert got.shape == (800, 1024) and set(np.unique(got)) <= {0, 7}
    expected = expected_revision(app, WIDE, client_clicks((800, 1024), fg, bg))
    np.testing.assert_array_equal(got == 7, expected)
    assert params["pixels"] == int(expected.sum()) and params["clicks"][0]["positive"] is True
    assert params["clicks"][0]["x"] == pytest.approx(700.5 / 1024) and params["clicks"][0]["y"] == pytest.approx(
        300.5 / 800
    )


def test_eight_concurrent_requests_on_different_images_do_not_mix(app):
    ids = [WIDE, *IMAGES]
    jobs = []
    for k in range(8):
        image_id = ids[k % 4]
        shape = (800, 1024) if image_id == WIDE else (1024, 1024)
        fg = [[100 + 90 * k, 150 + 60 * k, 0]]
        jobs.append((image_id, shape, fg))
    results: dict[int, object] = {}

    def run(k):
        image_id, _, fg = jobs[k]
        client = app.server.client(app.tmp / f"c{k}")
        (app.tmp / f"c{k}").mkdir(exist_ok=True)
        try:
            results[k] = client.infer("xflow_revise", image_id, {"finding": "opacity", "foreground": fg})
        except Exception as exc:  # collected and reported below
            results[k] = exc

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(not isinstance(r, Exception) for r in results.values()), results
    for k, (image_id, shape, fg) in enumerate(jobs):
        label, params = results[k]
        with Image.open(label) as img:
            got = np.asarray(img) == 4
        np.testing.assert_array_equal(got, expected_revision(app, image_id, client_clicks(shape, fg, [])))

    # and instructions at once (Stage 1 generation makes these slow on CPU): each answer is its own
    asks = [("effusion", "left lung"), ("edema", "right lung"), ("opacity", "left lung base"), ("cardiomegaly", "")]
    answers: dict[int, object] = {}

    def ask(k):
        finding, location = asks[k]
        client = app.server.client(app.tmp / f"c{k}")
        try:
            answers[k] = client.infer(
                "xflow", ids[k % 4], {"finding": finding, "location": location, "revise": False, "trace": False}
            )[1]
        except Exception as exc:
            answers[k] = exc

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    for k, (finding, location) in enumerate(asks):
        params = answers[k]
        assert not isinstance(params, Exception), params
        record = params["findings"][0]
        assert record["finding"] == finding and (not location or record["location"] == location)
        if not record["present"]:
            where = f" in the {location}" if location else ""
            assert params["answer"] == f"There is no {finding}{where}."


def datastore_state(app) -> tuple[str, dict]:
    listing = requests.get(f"{app.url}/datastore/?output=all", timeout=30).json()
    files = {
        str(p.relative_to(app.studies)): p.stat().st_size
        for p in app.studies.rglob("*")
        if p.is_file() and p.name != ".lock"
    }
    return json.dumps(listing, sort_keys=True), files


def bad_requests(app, tmp: Path, cxr_samples: Path) -> list[tuple[str, requests.Response]]:
    """At least 15 wrong requests of every kind; returns (what, response)."""
    text = tmp / "notes.png"
    text.write_text("this is not an image")
    truncated = tmp / "truncated.png"
    truncated.write_bytes((app.studies / f"{IMAGES[1]}.png").read_bytes()[:3000])
    volume = tmp / "volume.nii.gz"
    import nibabel as nib

    nib.save(nib.Nifti1Image(np.random.default_rng(0).uniform(0, 1, (64, 48, 5)).astype(np.float32), np.eye(4)), volume)
    lateral = tmp / "lateral.dcm"
    import pydicom

    ds = pydicom.dcmread(cxr_samples / "dicom" / "cr.dcm")
    ds.ViewPosition = "LL"
    ds.save_as(lateral)
    wrong_size = tmp / "small.png"
    Image.fromarray(np.zeros((100, 120), np.uint8)).save(wrong_size)
    out_of_range = tmp / "bright.png"
    Image.fromarray(np.full((1024, 1024), 200, np.uint8)).save(out_of_range)
    junk_label = tmp / "junk.nii.gz"
    junk_label.write_bytes(b"\x00garbage")
    good_label = tmp / "empty_label.png"
    Image.fromarray(np.zeros((1024, 1024), np.uint8)).save(good_label)

    def infer(model, image="", params=None, file=None):
        files = {"file": (file.name, file.read_bytes())} if file else None
        return requests.post(
            f"{app.url}/infer/{model}",
            params={"image": image} if image else None,
            data={"params": json.dumps(params or {})},
            files=files,
            timeout=120,
        )

    def save(image, label):
        return requests.put(
            f"{app.url}/datastore/label",
            params={"image": image, "tag": "final"},
            data={"params": "{}"},
            files={"label": (label.name, label.read_bytes())},
            timeout=60,
        )

    img = IMAGES[1]
    return [
        ("unknown image id", infer("xflow", "no_such_image", {"instruction": "edema"})),
        ("non-image upload", infer("xflow", params={"instruction": "edema"}, file=text)),
        ("truncated PNG", infer("xflow", params={"instruction": "edema"}, file=truncated)),
        ("multi-slice volume", infer("xflow", params={"instruction": "edema"}, file=volume)),
        ("lateral view", infer("xflow", params={"instruction": "edema"}, file=lateral)),
        ("unknown finding", infer("xflow", img, {"instruction": "segment the pneumothorax"})),
        ("empty instruction", infer("xflow", img, {"instruction": "   "})),
        ("bad result_extension", infer("xflow", img, {"result_extension": ".exe"})),
        ("over-long instruction", infer("xflow", img, {"instruction": "edema " * 400})),
        ("unknown picker finding", infer("xflow", img, {"finding": "banana"})),
        ("bad max_clicks", infer("xflow", img, {"instruction": "edema", "max_clicks": "lots"})),
        ("click outside", infer("xflow_revise", img, {"finding": "edema", "foreground": [[5000, 10, 0]]})),
        ("click on slice 3", infer("xflow_revise", img, {"finding": "edema", "foreground": [[10, 10, 3]]})),
        ("negative click index", infer("xflow_revise", img, {"finding": "edema", "background": [[-4, 10, 0]]})),
        ("revise without finding", infer("xflow_revise", img, {"foreground": [[10, 10, 0]]})),
        ("label of wrong size", save(img, wrong_size)),
        ("label values out of range", save(img, out_of_range)),
        ("junk label file", save(img, junk_label)),
        ("label for unknown image", save("no_such_image", good_label)),
        (
            "non-image added to datastore",
            requests.put(
                f"{app.url}/datastore/image",
                params={"image": "notes"},
                data={"params": "{}"},
                files={"file": ("notes.png", text.read_bytes())},
                timeout=60,
            ),
        ),
    ]


def test_bad_input_gets_4xx_with_a_reason_and_nothing_is_lost(app, tmp_path, cxr_samples):
    before = datastore_state(app)
    answers = bad_requests(app, tmp_path, cxr_samples)
    assert len(answers) >= 15
    expected_words = {
        "unknown image id": "unknown image",
        "non-image upload": "cannot load",
        "truncated PNG": "cannot load",
        "multi-slice volume": "volume",
        "lateral view": "lateral",
        "unknown finding": "pneumothorax",
        "empty instruction": "empty",
        "bad result_extension": "result_extension",
        "over-long instruction": "characters",
        "unknown picker finding": "banana",
        "bad max_clicks": "max_clicks",
        "click outside": "outside",
        "click on slice 3": "slice",
        "negative click index": "outside",
        "revise without finding": "which finding",
        "label of wrong size": "120 x 100",
        "label values out of range": "0..7",
        "junk label file": "unreadable",
        "label for unknown image": "unknown image",
        "non-image added to datastore": "cannot load",
    }
    for what, r in answers:
        assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
        detail = r.json()["detail"]
        assert expected_words[what] in detail, (what, detail)
    assert datastore_state(app) == before  # nothing written, nothing half-written
    label, params = app.client.infer("xflow", IMAGES[1], {"instruction": "edema", "revise": False})
    assert params["findings"][0]["finding"] == "edema" and Path(label).is_file()


def test_save_label_next_sample_scoring_and_train(app):
    # a final label with a finding, from the click tool, as an annotator would save it
    label, _ = app.client.infer("xflow_revise", IMAGES[0], {"finding": "effusion", "foreground": [[300, 500, 0]]})
    saved = app.client.save_label(IMAGES[0], label, tag="final")
    assert saved["image"] == IMAGES[0]
    assert app.client.info()["datastore"]["completed"] == 1

    first = app.client.next_sample("xflow_uncertainty", {})
    assert first["id"] != IMAGES[0] and first["fallback"] is True  # nothing scored yet: random unlabeled

    r = requests.post(
        f"{app.url}/scoring/xflow_uncertainty",
        params={"run_sync": "true"},
        json={"instruction": "effusion", "images": [IMAGES[2]], "max_clicks": 1},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    assert r.json()["scores"].keys() == {IMAGES[2]}
    info = requests.get(f"{app.url}/datastore/image/info", params={"image": IMAGES[2]}, timeout=30).json()
    assert 0.0 <= info["xflow_uncertainty"] <= 1.0
    picked = app.client.next_sample("xflow_uncertainty", {})
    assert picked["id"] == IMAGES[2] and picked["fallback"] is False

    # a second labeled image, held out by the train task to check the fine-tuned segmenter
    held_label = app.tmp / "held_label.png"
    held = np.zeros((800, 1024), np.uint8)
    held[300:500, 600:800] = 7
    Image.fromarray(held).save(held_label)
    app.client.save_label(WIDE, str(held_label), tag="final")

    # training: the server runs it in a subprocess; poll until it ends
    started = app.client.train_start("xflow", {"steps": 3, "lr": 1e-3})
    assert started["status"] in ("SUBMITTED", "RUNNING")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status = app.client.train_status()
        if status["status"] in ("DONE", "ERROR"):
            break
        time.sleep(2)
    assert status["status"] == "DONE", status.get("details")
    trained = app.tmp / "server" / "model" / "xflow_segmenter"
    stats = json.loads((trained.parent / "train_stats.json").read_text())
    assert stats["steps"] == 3 and stats["images"] == 1 and len(stats["losses"]) == 3
    assert all(np.isfinite(stats["losses"]))
    assert [Path(p).name for p in stats["heldout_images"]] == [f"{WIDE}.png"] and stats["weights_finite"]
    # promoted only when not worse than the serving segmenter on the held-out label, box-only and after clicks
    assert stats["promoted"] == (
        stats["heldout_iou_candidate"] >= stats["heldout_iou_current"]
        and stats["heldout_iou_clicks_candidate"] >= stats["heldout_iou_clicks_current"]
    )
    out = Path(stats["output"])
    assert out == (trained if stats["promoted"] else trained.with_name("xflow_segmenter.rejected"))

    from monailabel_xflow.segmenter.sam3 import load_tracker_model

    new, old = load_tracker_model(out).state_dict(), load_tracker_model(app.models.parent / "sam3").state_dict()
    changed = {k.split(".")[0] for k in new if not np.array_equal(new[k].numpy(), old[k].numpy())}
    assert "mask_decoder" in changed  # the weights really moved
    # the serving app picks a promoted segmenter up at its next request, and only a promoted one
    app.client.infer("xflow_revise", IMAGES[1], {"finding": "edema", "foreground": [[400, 400, 0]]})
    assert app.client.info()["xflow_models"]["trained_segmenter"] == (str(trained) if stats["promoted"] else None)
