"""``xflow segment`` end to end with tiny random models, and ``xflow weights`` argument handling.

``weights pull`` is only tested with ``snapshot_download`` replaced: tests never touch the network.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from PIL import Image

from monailabel_xflow.cli import main
from monailabel_xflow.workflow.trace import Trace


@pytest.fixture(scope="module")
def models_file(tmp_path_factory, tiny_models):
    """A YAML model configuration naming tiny random models saved to disk."""
    path = tiny_models(tmp_path_factory.mktemp("cli-models"))
    path.write_text(
        "vlm_base: vlm/base\ninit_adapter: vlm/init\nrev_adapter: vlm/rev\nsegmenter: sam3\n"
        "device: cpu\nmax_new_tokens: 16\n"
    )
    return path


@pytest.fixture(autouse=True)
def no_model_env(monkeypatch):
    for name in ("XFLOW_MODELS", "XFLOW_VLM_BASE", "XFLOW_INIT_MODEL", "XFLOW_SEGMENTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XFLOW_NO_DEMO", "1")  # without the demo fallback, nothing is configured


def _check_outputs(folder, shape):
    mask = np.asarray(Image.open(folder / "mask.png"))
    assert mask.shape == shape and mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 255}
    import nibabel as nib

    nifti = np.asarray(nib.load(str(folder / "mask.nii.gz")).dataobj)
    assert nifti.shape == (shape[1], shape[0], 1)  # (W, H, 1), as MONAI Label holds a radiograph
    np.testing.assert_array_equal(nifti[:, :, 0].T > 0, mask > 0)
    trace = Trace.from_json((folder / "trace.json").read_text())
    assert list(trace.image_size) == list(shape)
    np.testing.assert_array_equal(trace.final_mask(), mask > 0)
    overlays = sorted(p.name for p in (folder / "overlays").glob("*.png"))
    assert overlays[0] == "00_stage1.png" and overlays[-1].endswith("_final.png")
    sheet = np.asarray(Image.open(folder / "contact_sheet.png"))
    assert sheet.ndim == 3 and sheet.shape[2] == 3
    return trace


def test_segment_png(models_file, cxr_samples, tmp_path, capsys):
    out = tmp_path / "out"
    status = main(
        [
            "segment",
            str(cxr_samples / "nih" / "images" / "00000129_000.png"),
            "--instruction",
            "is there fluid on the left?",
            "--out",
            str(out),
            "--models",
            str(models_file),
            "--max-clicks",
            "2",
        ]
    )
    assert status == 0
    printed = capsys.readouterr().out.strip().splitlines()
    trace = _check_outputs(out, (1024, 1024))
    assert trace.instruction["instruction"] == "Segment the effusion in the left lung."
    assert trace.settings["max_clicks"] == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"][0]["folder"] == "." and printed == [summary["results"][0]["message"]]
    assert trace.models["segmenter"] == "sam3"  # as configured


def test_segment_dicom_all_findings(models_file, cxr_samples, tmp_path, capsys):
    dicom = cxr_samples / "dicom" / "cr.dcm"
    out = tmp_path / "all"
    status = main(
        ["segment", str(dicom), "--all-findings", "--out", str(out), "--models", str(models_file), "--no-revise", "-q"]
    )
    assert status == 0
    printed = capsys.readouterr().out.strip().splitlines()
    summary = json.loads((out / "summary.json").read_text())["results"]
    assert len(summary) == len(printed) == 7
    assert summary[0]["folder"] == "01_cardiomegaly" and printed[0].startswith("Segment the cardiomegaly. ")
    shape = np.asarray(Image.open(out / summary[0]["folder"] / "mask.png")).shape
    for entry in summary:
        trace = _check_outputs(out / entry["folder"], shape)
        assert trace.settings["revise"] is False and trace.batch["size"] == 7


def test_quiet_leaves_only_warnings_on_stderr(cxr_samples, tmp_path):
    """``xflow segment -q`` as a user runs it, on the demo: stderr keeps the demo notice, not
    transformers' weight-loading bars (shown without ``-q``)."""
    import subprocess
    import sys

    from monailabel_xflow.workflow.model_config import DEMO_MODELS_FILE

    png = str(cxr_samples / "nih" / "images" / "00000129_000.png")
    argv = ["segment", png, "-i", "edema", "--models", str(DEMO_MODELS_FILE), "--no-revise"]
    code = "import sys; from monailabel_xflow.cli import main; sys.exit(main(sys.argv[1:]))"

    def run(*extra: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-c", code, *argv, *extra], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    loud = run("--out", str(tmp_path / "loud")).stderr
    quiet = run("--out", str(tmp_path / "quiet"), "-q")
    assert "Loading weights" in loud and "Loading" not in quiet.stderr
    assert "demo model" in quiet.stderr and len(quiet.stdout.splitlines()) == 1 and "edema" in quiet.stdout


def _variant(models_file, tmp_path, **changes):
    """``models_file`` with ``changes``, its relative paths kept valid (written beside it)."""
    config = yaml.safe_load(models_file.read_text())
    path = models_file.parent / f"variant-{len(list(models_file.parent.glob('variant-*')))}.yaml"
    path.write_text(yaml.safe_dump({**config, **changes}))
    return path


def test_segment_bad_inputs_exit_2(models_file, cxr_samples, tmp_path, capsys):
    png = str(cxr_samples / "nih" / "images" / "00000129_000.png")
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("hello")
    swapped = _variant(models_file, tmp_path, vlm_base="sam3", segmenter="vlm/base")
    cases = [
        ([str(not_an_image), "-i", "effusion", "--models", str(models_file)], "cannot load"),
        ([str(tmp_path / "missing.dcm"), "-i", "effusion", "--models", str(models_file)], "cannot load"),
        ([png, "-i", "pneumothorax on the left", "--models", str(models_file)], "pneumothorax"),
        ([png, "-i", "effusion"], "no policy model configured"),
        ([png, "-i", "effusion", "--models", str(tmp_path / "none.yaml")], "does not exist"),
        ([png, "-i", "effusion", "--models", str(models_file), "--max-clicks", "-1"], "max-clicks"),
        ([png, "-i", "effusion", "--models", str(_variant(models_file, tmp_path, device="bogus"))], "'bogus'"),
        # a GPU models file on a machine without that GPU
        ([png, "-i", "effusion", "--models", str(_variant(models_file, tmp_path, device="cuda:63"))], "CUDA GPU"),
        # folders of the wrong kind: the segmenter where the VLM should be
        ([png, "-i", "effusion", "--models", str(swapped)], "cannot load the configured weights"),
    ]
    for argv, message in cases:
        assert main(["segment", *argv, "--out", str(tmp_path / "o")]) == 2, argv
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing written on bad input


def test_segment_requires_an_instruction(tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["segment", "x.png", "--out", str(tmp_path)])
    assert exc.value.code == 2


# --- xflow weights ----------------------------------------------------------------------------


@pytest.fixture()
def mixed_config(tmp_path):
    (tmp_path / "sam").mkdir()
    path = tmp_path / "m.yaml"
    path.write_text(
        "vlm_base: google/medgemma-1.5-4b-it\ninit_adapter: org/xflow-init@v1\n"
        "rev_adapter: org/xflow-rev\nsegmenter: sam\n"
    )
    return path


@pytest.fixture()
def fake_download(monkeypatch):
    import huggingface_hub

    calls = []

    def snapshot_download(repo_id, revision=None, token=None, local_files_only=False, **kwargs):
        calls.append({"repo_id": repo_id, "revision": revision, "token": token, "local_files_only": local_files_only})
        if repo_id == "org/broken":
            raise OSError("401 Unauthorized")
        if local_files_only:
            from huggingface_hub.errors import LocalEntryNotFoundError

            raise LocalEntryNotFoundError("not cached")
        return f"/cache/{repo_id.replace('/', '--')}"

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_weights_pull_fetches_only_hub_ids_with_the_token(mixed_config, fake_download, capsys):
    assert main(["weights", "pull", "--models", str(mixed_config), "--token", "hf_x"]) == 0
    assert [(c["repo_id"], c["revision"], c["token"], c["local_files_only"]) for c in fake_download] == [
        ("google/medgemma-1.5-4b-it", None, "hf_x", False),
        ("org/xflow-init", "v1", "hf_x", False),
        ("org/xflow-rev", None, "hf_x", False),
    ]
    out = capsys.readouterr().out
    assert "fetching google/medgemma-1.5-4b-it" in out and "fetching org/xflow-init at v1" in out
    assert "-> /cache/org--xflow-rev" in out and "sam" not in out.replace("xflow", "")


def test_weights_pull_dry_run_and_explicit_ids(mixed_config, fake_download, capsys):
    assert main(["weights", "pull", "--models", str(mixed_config), "--dry-run"]) == 0
    assert fake_download == [] and capsys.readouterr().out.count("would fetch") == 3
    assert main(["weights", "pull", "org/one", "org/one", "org/two@main"]) == 0
    assert [(c["repo_id"], c["revision"], c["token"]) for c in fake_download] == [
        ("org/one", None, None),
        ("org/two", "main", None),
    ]


def test_weights_pull_errors(tmp_path, fake_download, capsys):
    assert main(["weights", "pull", "not-a-repo"]) == 2
    assert "not a hub id" in capsys.readouterr().err
    assert main(["weights", "pull", "org/broken"]) == 1
    assert "401 Unauthorized" in capsys.readouterr().err
    local = tmp_path / "local.yaml"
    (tmp_path / "sam").mkdir()
    local.write_text("init_model: sam\nsegmenter: sam\n")
    assert main(["weights", "pull", "--models", str(local)]) == 0
    assert "nothing to pull" in capsys.readouterr().out
    assert main(["weights", "pull", "--models", str(tmp_path / "missing.yaml")]) == 2


def test_weights_show_says_when_it_is_the_demo_and_when_nothing_can_run(tmp_path, monkeypatch, capsys):
    for name in ("XFLOW_MODELS", "XFLOW_VLM_BASE", "XFLOW_INIT_MODEL", "XFLOW_SEGMENTER", "XFLOW_NO_DEMO"):
        monkeypatch.delenv(name, raising=False)
    assert main(["weights", "show"]) == 0
    assert capsys.readouterr().out.startswith("the demo model")
    segmenter_only = tmp_path / "seg.yaml"
    segmenter_only.write_text("segmenter: /nonexistent/seg\n")
    assert main(["weights", "show", "--models", str(segmenter_only)]) == 2
    out = capsys.readouterr().out
    assert "MISSING" in out and "not runnable: no policy model configured" in out


def test_weights_show_never_downloads(mixed_config, fake_download, capsys):
    assert main(["weights", "show", "--models", str(mixed_config)]) == 0
    out = capsys.readouterr().out
    assert "MISSING" in out and "xflow weights pull" in out and "ready:" in out
    assert fake_download and all(c["local_files_only"] for c in fake_download)
