"""The ``rosalia`` task beside ``xflow`` in a real MONAI Label server, driven by Slicer's client.

One server (``python -m monailabel.main start_server --app WORKSPACE``) with tiny random XFlow
models and no ``rosalia`` key: the task serves the committed ROSALIA demo, which ``/info`` names.
Its labels are compared with the same demo run in this process. The ``rosalia`` key of a models
file is checked on the runtime directly.
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import requests
from PIL import Image
from servers import monailabel_server

from monailabel_xflow.app.errors import ModelsNotConfiguredError
from monailabel_xflow.rosalia.runtime import RosaliaRuntime
from monailabel_xflow.rosalia.weights import ROSALIA_DEMO_DIR, ROSALIA_DEMO_NAME

pytestmark = pytest.mark.timeout(900)

WIDE = "wide_00000129"  # 1024 wide, 800 high
IMAGE = "00001933_000"


@pytest.fixture(scope="module")
def app(tmp_path_factory, cxr_samples, tiny_models):
    tmp = tmp_path_factory.mktemp("rosalia_app")
    models = tiny_models(tmp / "models")
    studies = tmp / "studies"
    studies.mkdir()
    shutil.copy(cxr_samples / "nih" / "images" / f"{IMAGE}.png", studies)
    Image.open(cxr_samples / "nih" / "images" / "00000129_000.png").crop((0, 0, 1024, 800)).save(
        studies / f"{WIDE}.png"
    )
    with monailabel_server(studies, tmp / "server", conf={"models": str(models)}) as server:
        yield SimpleNamespace(server=server, url=server.url, studies=studies, tmp=tmp, client=server.client(tmp))


def in_process(app, image_id: str, instruction: str):
    from monailabel_xflow.rosalia.predictor import RosaliaPredictor
    from monailabel_xflow.transforms.loading import load_cxr

    if not hasattr(app, "predictor"):
        app.predictor = RosaliaPredictor.from_pretrained(ROSALIA_DEMO_DIR, device="cpu")
    image, _ = load_cxr(app.studies / f"{image_id}.png")
    app.predictor.set_image(image)
    return app.predictor.predict(instruction)


def test_info_lists_rosalia_beside_xflow_and_names_the_demo(app):
    info = app.client.info()
    task = info["models"]["rosalia"]
    assert task["type"] == "segmentation" and task["dimension"] == 2 and task["labels"]["effusion"] == 7
    assert {"instruction", "finding", "location", "overlay", "trace", "store_seg", "label_values"} == set(
        task["config"]
    )
    assert task["config"]["store_seg"] is False  # no --conf store_seg: off, as for xflow
    assert task["config"]["store_seg"] == info["models"]["xflow"]["config"]["store_seg"]
    assert "xflow" in info["models"] and "xflow_revise" in info["models"]
    status = info["rosalia_models"]
    assert status["source"] == "demo" and status["model_name"] == ROSALIA_DEMO_NAME and status["loaded"]
    assert "not for clinical images" in status["demo"]
    assert ROSALIA_DEMO_NAME in task["description"]


def test_infer_matches_the_demo_in_this_process(app):
    for image_id, shape in ((WIDE, (800, 1024)), (IMAGE, (1024, 1024))):
        label, params = app.client.infer("rosalia", image_id, {"instruction": "Segment the effusion in the left lung."})
        mask, answer, trace = in_process(app, image_id, "Segment the effusion in the left lung.")
        with Image.open(label) as img:
            got = np.asarray(img)
        assert got.shape == shape and set(np.unique(got).tolist()) <= {0, 7}
        np.testing.assert_array_equal(got == 7, mask)
        record = params["findings"][0]
        assert record["answer"] == answer and record["present"] == bool(mask.any())
        assert "[SEG]" not in params["answer"]
        assert params["traces"][0]["raw_text"] == trace["raw_text"] and params["traces"][0]["model"] == "rosalia"


def test_ohif_result_format_is_honoured_as_by_xflow(app):
    """OHIF's panel asks for NRRD: the same voxels as the PNG label, the answer in the header."""
    import nrrd

    ask = {"instruction": "Segment the effusion in the left lung."}
    png_label, _ = app.client.infer("rosalia", WIDE, ask)
    label, params = app.client.infer("rosalia", WIDE, {**ask, "result_extension": ".nrrd", "result_dtype": "uint8"})
    assert label.endswith(".nrrd")
    data, header = nrrd.read(label)
    with Image.open(png_label) as img:
        np.testing.assert_array_equal(data[..., 0].T, np.asarray(img))  # (W, H, 1) as MONAI Label holds images
    assert header["xflow_answer"] == params["answer"]
    with pytest.raises(Exception, match="result_extension"):
        app.client.infer("rosalia", WIDE, {**ask, "result_extension": ".exe"})


def test_pickers_and_several_findings_paint_one_label(app):
    label, params = app.client.infer(
        "rosalia", IMAGE, {"finding": "all findings", "location": "right lung", "trace": False, "overlay": True}
    )
    assert [r["finding"] for r in params["findings"]] == [
        "pneumonia",
        "atelectasis",
        "opacity",
        "consolidation",
        "edema",
        "effusion",
    ]
    assert "traces" not in params and params["overlay_png_base64"]
    with Image.open(label) as img:
        values = set(np.unique(np.asarray(img)).tolist())
    assert values <= {0} | {r["label_value"] for r in params["findings"] if r["present"]}


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(app):
    bad = requests.post(
        f"{app.url}/infer/rosalia",
        params={"image": IMAGE},
        data={"params": '{"instruction": "Segment the pneumothorax."}'},
        timeout=120,
    )
    assert bad.status_code == 422 and "pneumothorax" in bad.json()["detail"]
    missing = requests.post(
        f"{app.url}/infer/rosalia",
        params={"image": "no_such_image"},
        data={"params": '{"instruction": "Segment the edema."}'},
        timeout=120,
    )
    assert missing.status_code == 404
    wrong = requests.post(
        f"{app.url}/infer/rosalia",
        params={"image": IMAGE},
        data={"params": '{"instruction": "Segment the edema.", "trace": "maybe"}'},
        timeout=120,
    )
    assert wrong.status_code == 422
    _, params = app.client.infer("rosalia", IMAGE, {"instruction": "Segment the edema."})
    assert params["findings"][0]["finding"] == "edema"


def test_store_seg_on_a_studies_folder_answers_422_naming_the_problem(app):
    """``store_seg`` needs a DICOMweb PACS (tested with Orthanc in ``test_ohif_viewer``): on a
    studies folder the request answers 422 saying so, as ``xflow`` does, and nothing is written."""
    before = sorted(p.name for p in app.studies.rglob("*"))
    for task in ("rosalia", "xflow"):
        r = requests.post(
            f"{app.url}/infer/{task}",
            params={"image": IMAGE},
            data={"params": '{"instruction": "Segment the edema.", "store_seg": true}'},
            timeout=300,
        )
        assert r.status_code == 422, (task, r.text)
        assert "store_seg: the studies are not a DICOMweb PACS" in r.json()["detail"]
    r = requests.post(
        f"{app.url}/infer/rosalia",
        params={"image": IMAGE},
        data={"params": '{"instruction": "Segment the edema.", "store_seg": "maybe"}'},
        timeout=120,
    )
    assert r.status_code == 422 and "store_seg" in r.json()["detail"]
    assert sorted(p.name for p in app.studies.rglob("*")) == before
    _, params = app.client.infer("rosalia", IMAGE, {"instruction": "Segment the edema.", "store_seg": False})
    assert "seg_series" not in params and "store_seg" not in params


def test_models_file_key_and_demo_switch(tiny_rosalia, tmp_path):
    (tmp_path / "tiny").symlink_to(tiny_rosalia, target_is_directory=True)
    models = tmp_path / "models.yaml"
    models.write_text("vlm_base: ./vlm\ninit_adapter: ./init\nsegmenter: ./sam3\nrosalia: ./tiny\ndevice: cpu\n")
    runtime = RosaliaRuntime({"models": str(models)}, environ={}, preload=False)
    assert runtime.status()["source"] == "config" and runtime.path == (tmp_path / "tiny").resolve()
    assert runtime.get().model.meta["size"] == "tiny"
    off = RosaliaRuntime({}, environ={"XFLOW_NO_DEMO": "1"}, preload=False)
    assert not off.status()["configured"] and "rosalia:" in off.status()["message"]
    with pytest.raises(ModelsNotConfiguredError):
        off.get()
    env_key = RosaliaRuntime({}, environ={"XFLOW_ROSALIA": str(tmp_path / "tiny")}, preload=False)
    assert env_key.source == "config"
