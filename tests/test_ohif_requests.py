"""What OHIF's MONAI Label panel sends, answered by the tasks (no server: scripted models).

The panel's requests (DESIGN §15): auto-segmentation posts the task's options back unchanged plus
``result_extension: ".nrrd"``, ``result_dtype: "uint8"``, ``result_compress: false``,
``restore_label_idx: false`` with ``output=image`` (only the file comes back); point prompts key a
``deepedit`` model's clicks by label name.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_app_tasks import (  # noqa: F401
    BOTH_GT,
    EDEMA_GT,
    EFFUSION_GT,
    H,
    W,
    box_of,
    infer_task,
    png,  # a fixture: the tests that take it redefine the name (F811 ignored here, pyproject.toml)
    read_monai,
    revise_task,
    stage1,
)

from monailabel_xflow.app.errors import RequestError
from monailabel_xflow.testing import ScriptedSegmenter
from monailabel_xflow.transforms import labels as label_io
from monailabel_xflow.vocabulary import FINDINGS

PANEL = {"result_extension": ".nrrd", "result_dtype": "uint8", "result_compress": False, "restore_label_idx": False}


def panel_request(task, image) -> dict:
    """The auto-segmentation request: the options exactly as ``/info`` lists them, plus PANEL."""
    return {"image": str(image), **task.config(), **PANEL}


def test_auto_segmentation_asks_every_finding_and_gets_a_parsable_nrrd(png):
    import nrrd

    task = infer_task([stage1(False)] * 6 + [stage1(True, [box_of(EFFUSION_GT)])])  # FINDINGS order: effusion last
    label_file, params = task({**panel_request(task, png), "revise": False})
    assert [f["finding"] for f in params["findings"]] == list(FINDINGS)  # no instruction = all findings
    assert label_file.endswith(".nrrd")
    data, header = nrrd.read(label_file)
    assert data.dtype == np.uint8 and data.shape == (W, H, 1)  # (W, H, 1) as MONAI Label holds images
    np.testing.assert_array_equal(data[..., 0].T == 7, EFFUSION_GT)
    assert header["xflow_answer"] == params["answer"] and "There is no edema." in params["answer"]
    # the same voxels as the default NIfTI answer, in the same place
    nifti, _ = infer_task([stage1(True, [box_of(EFFUSION_GT)])])({"image": str(png), "instruction": "effusion"})
    np.testing.assert_array_equal(
        read_monai(nifti)[..., 0] if read_monai(nifti).ndim == 3 else read_monai(nifti), data[..., 0]
    )


@pytest.mark.parametrize(
    "ext,dtype", [(".nii.gz", "int16"), (".nii", "uint8"), (".nrrd", "float32"), (".png", "uint8")]
)
def test_result_extension_and_dtype_are_honoured(png, ext, dtype):
    from monailabel_xflow.transforms.labels import answer_of_file

    task = infer_task([stage1(True, [box_of(EFFUSION_GT)])])
    label_file, params = task(
        {"image": str(png), "instruction": "effusion", "result_extension": ext, "result_dtype": dtype}
    )
    assert label_file.endswith(ext)
    np.testing.assert_array_equal(label_io.read_label(label_file, (H, W)) == 7, EFFUSION_GT)
    if ext != ".png":
        assert answer_of_file(label_file) == params["answer"]
        import nibabel as nib
        import nrrd

        stored = nrrd.read(label_file)[0].dtype if ext == ".nrrd" else nib.load(label_file).get_data_dtype()
        assert np.dtype(stored) == np.dtype(dtype)


@pytest.mark.parametrize(
    "bad,word",
    [
        ({"result_extension": ".exe"}, "result_extension"),
        ({"result_dtype": "complex64"}, "result_dtype"),
        ({"result_extension": ".png", "result_dtype": "float32"}, "result_dtype"),
        ({"store_seg": "maybe"}, "store_seg"),
    ],
)
def test_bad_format_options_name_the_option(png, bad, word):
    task = infer_task([stage1(True, [box_of(EFFUSION_GT)])])
    with pytest.raises(RequestError, match=word):
        task.run({**task.config(), "image": str(png), "instruction": "effusion", **bad})


def test_point_prompts_keyed_by_label_name_revise_that_finding(png):
    seg = ScriptedSegmenter(BOTH_GT, positive_radius_px=10)
    label_file, params = revise_task(seg)({"image": str(png), **PANEL, "edema": [[70, 60, 0]], "background": []})
    assert params["finding"] == "edema" and label_file.endswith(".nrrd")
    click = seg.calls[-1].clicks[0][0]
    assert click.positive
    out = label_io.read_label(label_file, (H, W))
    assert out[60, 70] == 6 and not (out == 7).any()


def test_point_prompts_for_several_findings_need_a_choice(png):
    from monailabel_xflow.task_options import label_keyed_clicks

    two = {"edema": [[70, 60, 0]], "effusion": [[230, 190, 0]], "background": []}
    with pytest.raises(RequestError, match="several findings"):
        label_keyed_clicks(two)
    assert label_keyed_clicks({**two, "finding": "effusion"}) == {"foreground": [[230, 190, 0]]}
    with pytest.raises(RequestError, match="clicks are for edema"):
        label_keyed_clicks({"edema": [[70, 60, 0]], "finding": "effusion"})
    assert label_keyed_clicks({"foreground": [[1, 1, 0]], "edema": [[70, 60, 0]]}) == {}


@pytest.mark.parametrize(
    "module,config,task", [("xflow", "XFlowConfig", "xflow"), ("rosalia", "RosaliaConfig", "rosalia")]
)
def test_store_seg_server_setting_is_the_default_of_the_option(tmp_path, monkeypatch, module, config, task):
    """``--conf store_seg true`` makes ``store_seg`` default to true in the ``xflow`` and ``rosalia``
    options (what ``/info`` lists and OHIF's panel sends back); a bad value names the setting."""
    from monailabel_xflow.app import configs

    monkeypatch.setenv("XFLOW_NO_DEMO", "1")  # the option, not the weights, is under test
    cls = getattr(configs, config)

    def tasks(conf):
        cfg = cls()
        cfg.init(task, str(tmp_path / "model"), conf, None)
        return cfg.infer()

    assert tasks({"store_seg": "true"})[task].config()["store_seg"] is True
    assert tasks({})[task].config()["store_seg"] is False
    with pytest.raises(RequestError, match="--conf store_seg"):
        tasks({"store_seg": "sometimes"})


def test_store_seg_needs_a_pacs(tmp_path):
    from monailabel_xflow.app.datastore import XFlowLocalDatastore
    from monailabel_xflow.app.xflow_app import store_result_seg

    store = XFlowLocalDatastore(str(tmp_path), extensions=["*.png"])
    result = {"file": None, "params": {"store_seg": {"findings": ["edema"]}}}
    with pytest.raises(RequestError, match="store_seg: the studies are not a DICOMweb PACS"):
        store_result_seg(store, "image", result)
    untouched = {"file": None, "params": {"answer": "There is no edema."}}
    store_result_seg(store, "image", untouched)  # not asked: nothing to do, nothing added
    assert untouched["params"] == {"answer": "There is no edema."}
