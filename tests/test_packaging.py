"""What a user of the package relies on, checked quickly in the suite: one version, every module
importable, package data that covers what the package reads at run time, the app served from a
workspace outside the package, and tests that read nothing outside the repository.

The wheel itself (built, installed into a fresh virtual environment outside the checkout, served
and asked for one answer) is checked by ``.ci/wheel-check``, which ``.ci/run`` calls after the suite.
"""

from __future__ import annotations

import configparser
import importlib
import logging
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sources import package_files

import monailabel_xflow

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "monailabel_xflow"


def setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg


def tracked(folder: Path) -> list[Path]:
    """Files git tracks under ``folder`` (what a clone and the sdist hold); a tracked link to a
    folder of the repository (``monailabel_xflow/transforms``) stands for the files under it."""
    out = subprocess.run(["git", "ls-files", "-z", str(folder)], cwd=REPO, capture_output=True, check=True).stdout
    files = []
    for path in (REPO / p for p in out.decode().split("\0") if p):
        if path.is_symlink() and path.is_dir():
            files += [path / f.relative_to(path.resolve()) for f in tracked(path.resolve())]
        else:
            files.append(path)
    return files


# --- one version --------------------------------------------------------------------------------


def test_the_version_has_one_source():
    cfg = setup_cfg()
    assert cfg["metadata"]["version"] == "attr: monailabel_xflow.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", monailabel_xflow.__version__)
    assert "version" not in (REPO / "pyproject.toml").read_text().split("[build-system]")[0]
    from importlib.metadata import version

    assert version("monailabel-xflow") == monailabel_xflow.__version__  # the installed metadata agrees
    assert f"## {monailabel_xflow.__version__} " in (REPO / "CHANGELOG.md").read_text()


def test_xflow_version_prints_it(capsys):
    from monailabel_xflow.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"xflow {monailabel_xflow.__version__}\n"


def test_the_app_reports_the_package_version(tmp_path, monkeypatch, monailabel_settings):
    from monailabel_xflow.app.xflow_app import XFlowApp

    monkeypatch.setenv("XFLOW_NO_DEMO", "1")  # the version, not the weights, is under test
    app = XFlowApp(str(tmp_path / "workspace"), str(tmp_path), {"model_dir": str(tmp_path / "model")})
    assert app.info()["version"] == monailabel_xflow.__version__


def test_classifiers_name_only_the_tested_python():
    classifiers = setup_cfg()["metadata"]["classifiers"].split()
    versions = [c for c in classifiers if re.fullmatch(r"3\.\d+", c)]
    assert versions == [f"{sys.version_info.major}.{sys.version_info.minor}"] == ["3.11"]


# --- packages and package data ------------------------------------------------------------------


def test_every_folder_of_python_files_is_a_package_and_found():
    from setuptools import find_packages

    folders = {p.parent for p in package_files()}
    missing_init = sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").is_file())
    assert missing_init == []  # find: would silently leave such a folder out of the wheel
    expected = {".".join(f.relative_to(REPO).parts) for f in folders}
    assert setup_cfg()["options"]["packages"].strip() == "find:"
    assert set(find_packages(str(REPO), include=["monailabel_xflow", "monailabel_xflow.*"])) == expected


def test_every_module_imports():
    names = [m.name for m in pkgutil.walk_packages(monailabel_xflow.__path__, "monailabel_xflow.")]
    assert (
        len(names) > 80 and "monailabel_xflow.transforms.loading" in names and "monailabel_xflow.app.configs" in names
    )
    for name in names:
        importlib.import_module(name)


def declared_package_data() -> set[Path]:
    patterns = setup_cfg()["options.package_data"]["monailabel_xflow"].split()
    return {p for pattern in patterns for p in PACKAGE.glob(pattern) if p.is_file()}


def test_package_data_covers_every_file_the_package_holds():
    """Every tracked non-Python file under ``monailabel_xflow/`` is declared package data, so the
    wheel holds what the checkout holds (the demo models read through ``Path(__file__)``)."""
    data = {p for p in tracked(PACKAGE) if p.suffix != ".py"}
    assert data and data <= declared_package_data(), sorted(str(p) for p in data - declared_package_data())


def test_the_folders_read_through_path_file_are_package_data():
    from monailabel_xflow.rosalia.weights import ROSALIA_DEMO_DIR
    from monailabel_xflow.workflow.model_config import DEMO_DIR

    declared = declared_package_data()
    for folder in (DEMO_DIR, ROSALIA_DEMO_DIR):
        assert PACKAGE in folder.parents
        files = {p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
        assert files and files <= declared, folder
    # Every module that finds files next to its own source is listed here once what it reads is
    # package data; a path above the package (e.g. a repository folder) would be site-packages
    # once installed, so such a module must take its folder from an option or a user data dir.
    reads = {p.relative_to(PACKAGE).as_posix() for p in package_files() if "Path(__file__)" in p.read_text()}
    assert reads == {"workflow/model_config.py"}, "Path(__file__) reads to check: " + ", ".join(sorted(reads))


# --- the design card's layout --------------------------------------------------------------------


def test_the_transforms_live_at_the_top_level_and_the_package_links_to_them():
    """``transforms/`` is the source of ``monailabel_xflow.transforms`` (docs/architecture.md,
    "Where the files are"): git holds a relative link, so a clone, the editable install, mypy and
    the wheel all see one package."""
    import os

    link = PACKAGE / "transforms"
    assert link.is_symlink() and os.readlink(link) == "../transforms"
    staged = subprocess.run(
        ["git", "ls-files", "-s", "monailabel_xflow/transforms"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert staged[0] == "120000"  # a symbolic link in git, not a copy
    import monailabel_xflow.transforms.loading as loading

    assert Path(loading.__file__).resolve() == REPO / "transforms" / "loading.py"
    assert {p.name for p in tracked(REPO / "transforms")} >= {"__init__.py", "loading.py", "labels.py"}


def test_package_files_walks_into_the_linked_transforms_as_pkgutil_does():
    walked = set()
    for path in package_files():
        parts = path.relative_to(REPO).with_suffix("").parts
        walked.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    imported = {m.name for m in pkgutil.walk_packages(monailabel_xflow.__path__, "monailabel_xflow.")}
    assert walked == imported | {"monailabel_xflow"}
    assert "monailabel_xflow.transforms.labels" in walked
    assert not any("transforms" in p.parts for p in PACKAGE.rglob("*.py"))  # why package_files exists


def test_monai_label_finds_the_packaged_app_in_apps_xflow(tmp_path):
    """``apps/xflow/main.py`` is what upstream's loader expects (a direct ``MONAILabelApp``
    subclass in the module), and ``xflow serve --workspace apps/xflow`` would serve it as it is."""
    import shutil

    from monailabel.utils.others.class_utils import get_class_of_subclass_from_file

    from monailabel_xflow.app.xflow_app import XFlowApp
    from monailabel_xflow.commands.serve import prepare_workspace

    app = REPO / "apps" / "xflow"
    assert get_class_of_subclass_from_file("main", str(app / "main.py"), "MONAILabelApp") is XFlowApp
    assert "monailabel start_server --app apps/xflow" in (app / "README.md").read_text()
    copy = tmp_path / "xflow"
    shutil.copytree(app, copy)
    assert prepare_workspace(copy) == copy.resolve()
    assert (copy / "main.py").read_text() == (app / "main.py").read_text()  # never rewritten


def test_the_app_sets_only_the_settings_left_at_monai_labels_defaults(tmp_path, monailabel_settings):
    from monailabel_xflow.app import server_defaults

    settings = monailabel_settings
    set_now = server_defaults.apply(tmp_path / "app")
    assert settings.MONAI_LABEL_DICOMWEB_CACHE_EXPIRY == 10 and set_now["MONAI_LABEL_DICOMWEB_CACHE_EXPIRY"] == 10
    assert str(tmp_path / "app" / "cache" / "sessions") == settings.MONAI_LABEL_SESSION_PATH
    assert str(tmp_path / "app" / "cache" / "dicomweb") == settings.MONAI_LABEL_DICOMWEB_CACHE_PATH
    assert "*.tif" not in settings.MONAI_LABEL_DATASTORE_FILE_EXT and "*.dcm" in settings.MONAI_LABEL_DATASTORE_FILE_EXT
    # a value the user set (anything but MONAI Label's default) wins, even once exported by start_server
    fields = type(settings).model_fields
    current = {key: field.default for key, field in fields.items()}
    current.update(MONAI_LABEL_DICOMWEB_CACHE_EXPIRY=60, MONAI_LABEL_DATASTORE_CACHE_PATH="/srv/cache")
    wanted = server_defaults.defaults(tmp_path, current)
    assert "MONAI_LABEL_DICOMWEB_CACHE_EXPIRY" not in wanted and "MONAI_LABEL_DICOMWEB_CACHE_PATH" not in wanted
    assert set(wanted) == {
        "MONAI_LABEL_SESSION_PATH",
        "MONAI_LABEL_DATASTORE_FILE_EXT",
        "MONAI_LABEL_DICOMWEB_SEARCH_FILTER",
    }
    assert settings.MONAI_LABEL_DICOMWEB_SEARCH_FILTER == {"Modality": "CR,DX"}


# --- the app from a workspace -------------------------------------------------------------------


def test_monai_label_finds_the_packaged_app_in_a_workspace(tmp_path):
    from monailabel.utils.others.class_utils import get_class_of_subclass_from_file

    from monailabel_xflow.app.xflow_app import XFlowApp
    from monailabel_xflow.commands.serve import WORKSPACE_MAIN, prepare_workspace

    workspace = prepare_workspace(tmp_path / "ws")
    assert (workspace / "main.py").read_text() == WORKSPACE_MAIN
    # MONAI Label's own loader (monailabel.interfaces.utils.app.app_instance) on the pointer
    assert get_class_of_subclass_from_file("main", str(workspace / "main.py"), "MONAILabelApp") is XFlowApp
    assert prepare_workspace(workspace) == workspace  # idempotent


def test_a_workspace_is_never_inside_the_package_or_another_app(tmp_path):
    from monailabel_xflow.commands.serve import WorkspaceError, default_workspace, prepare_workspace

    with pytest.raises(WorkspaceError, match="where Python packages live"):
        prepare_workspace(PACKAGE / "workspace")
    assert not (PACKAGE / "workspace").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "main.py").write_text("class MyApp: ...\n")
    with pytest.raises(WorkspaceError, match="--app"):
        prepare_workspace(other)
    assert (other / "main.py").read_text() == "class MyApp: ...\n"
    assert default_workspace({"XFLOW_WORKSPACE": str(tmp_path / "w")}) == tmp_path / "w"
    assert default_workspace({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "monailabel-xflow" / "workspace"


def test_conf_models_file_is_the_key_and_models_still_works_with_a_warning(caplog):
    from monailabel_xflow.app.xflow_app import app_conf

    with caplog.at_level(logging.WARNING, "monailabel_xflow.app.xflow_app"):
        assert app_conf({"models_file": "/a.yaml"})["models"] == "/a.yaml"
        assert caplog.records == []
        assert app_conf({"models": "/b.yaml"})["models"] == "/b.yaml"
        assert "--conf models is deprecated" in caplog.text and "models_file /b.yaml" in caplog.text
        caplog.clear()
        assert app_conf({"models_file": "/a.yaml", "models": "/b.yaml"})["models"] == "/a.yaml"
        assert "using models_file" in caplog.text


# --- tests from a plain clone -------------------------------------------------------------------


def test_nothing_reads_outside_the_repository():
    """No test, benchmark, CI script or Makefile names the folder beside the repository."""
    outside = re.compile(r"\.\./shared|parent\s*/\s*[\"']shared[\"']|cxr-samples|XFLOW_SHARED")
    me = Path(__file__).resolve()
    files = [
        p
        for p in tracked(REPO / "tests") + tracked(REPO / "benchmarks") + tracked(REPO / ".ci") + [REPO / "Makefile"]
        if p.suffix in ("", ".py", ".sh") and p.resolve() != me
    ]
    assert len(files) > 50
    hits = [
        f"{p.relative_to(REPO)}:{i}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if outside.search(line)
    ]
    assert hits == []


def test_the_dicom_fixtures_hold_the_committed_pngs(cxr_samples):
    import pydicom
    from PIL import Image
    from radiographs import CR_SOURCE, DATA, DX_SOURCE

    cr = pydicom.dcmread(cxr_samples / "dicom" / "cr.dcm")
    mono1 = pydicom.dcmread(cxr_samples / "dicom" / "cr_monochrome1.dcm")
    dx = pydicom.dcmread(cxr_samples / "dicom" / "dx.dcm")
    png = np.asarray(Image.open(DATA / CR_SOURCE).convert("L")).astype(np.float64)
    assert (cr.Modality, cr.file_meta.TransferSyntaxUID, cr.PhotometricInterpretation) == (
        "CR",
        "1.2.840.10008.1.2.4.50",
        "MONOCHROME2",
    )
    assert "ImagePositionPatient" not in cr and cr.ViewPosition == "PA"
    assert np.abs(cr.pixel_array - png).mean() < 2.0  # JPEG quality 95
    assert mono1.PhotometricInterpretation == "MONOCHROME1" and np.array_equal(mono1.pixel_array, cr.pixel_array)
    assert mono1.SOPInstanceUID != cr.SOPInstanceUID
    assert (dx.Modality, dx.BitsStored, dx.PresentationIntentType) == ("DX", 12, "FOR PRESENTATION")
    assert np.array_equal(dx.pixel_array, np.asarray(Image.open(DATA / DX_SOURCE).convert("L")).astype(np.uint16) * 16)
    assert not any(p.is_symlink() for p in cxr_samples.rglob("*"))
