"""The fence around MONAI Label (monailabel_xflow/app/wraps.py): every replaced upstream function's
signature pinned against the installed MONAI Label, the app's replacements and overrides take
upstream's parameters, nothing unlisted is installed, and the server refuses a MONAI Label outside
the supported range unless told otherwise (the version faked)."""

from __future__ import annotations

import inspect
import logging
import os
import sys

import pytest

from monailabel_xflow.app import wraps
from monailabel_xflow.app.wraps import PATCHES, RELIED_ON, original
from monailabel_xflow.serving.patching import signature_of


@pytest.mark.parametrize("patch", PATCHES, ids=[f"{p.layer}:{p.target}" for p in PATCHES])
def test_each_replaced_function_has_the_recorded_upstream_signature(patch):
    """An upgrade that changes a replaced function fails here, not at a user's desk."""
    assert signature_of(original(patch.target)) == patch.signature
    assert patch.why and patch.layer in ("guard", "slicer")


@pytest.mark.parametrize("target", sorted(RELIED_ON))
def test_each_upstream_callable_the_app_relies_on_has_the_recorded_signature(target):
    assert signature_of(original(target)) == RELIED_ON[target]


def _names(fn):
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


@pytest.fixture
def recorded(monkeypatch):
    """``{layer: {target: replacement}}`` as guard.install and slicer.install hand them to
    wraps.install, recorded instead of installed (MONAI Label's modules stay untouched)."""
    import monailabel.app  # noqa: F401  (slicer.install acts in the server process only)
    from fastapi import FastAPI

    from monailabel_xflow.app import guard, slicer

    found: dict[str, dict] = {}

    def record(layer, replacements):
        found[layer] = dict(replacements)
        return list(replacements)

    monkeypatch.setattr(guard, "install_patches", record)
    monkeypatch.setattr(slicer, "install_patches", record)
    assert guard.install(FastAPI()) and slicer.install()
    return found


def test_the_app_installs_exactly_the_listed_patches_and_each_takes_upstreams_parameters(recorded):
    listed = {(p.layer, p.target) for p in PATCHES}
    assert {(layer, t) for layer, found in recorded.items() for t in found} == listed
    for patch in PATCHES:
        replacement = recorded[patch.layer][patch.target]
        assert _names(replacement) == _names(original(patch.target)), patch.target


def test_install_refuses_a_replacement_that_is_not_listed_and_a_listed_one_missing():
    guard_targets = [p.target for p in PATCHES if p.layer == "guard"]
    with pytest.raises(KeyError, match="not listed"):
        wraps.install("guard", {t: print for t in [*guard_targets, "monailabel.endpoints.infer.send_response"]})
    with pytest.raises(KeyError, match="listed but not given"):
        wraps.install("guard", {t: print for t in guard_targets[1:]})
    with pytest.raises(KeyError):
        wraps.install("h34", {"monailabel.endpoints.datastore.remove_image": print})


def _app_classes():
    from monailabel_xflow.app import configs, datastore, revise, scoring, strategy, task, train, xflow_app

    modules = (configs, datastore, revise, scoring, strategy, task, train, xflow_app)
    return sorted(
        {c for m in modules for c in vars(m).values() if inspect.isclass(c) and c.__module__ == m.__name__},
        key=lambda c: c.__qualname__,
    )


def test_every_upstream_method_the_app_overrides_keeps_upstreams_signature():
    """MONAI Label calls the app's datastores, tasks and app class by upstream's signatures."""
    checked = []
    for cls in _app_classes():
        bases = [b for b in cls.__mro__ if b.__module__.startswith("monailabel.")]
        for name, member in vars(cls).items():
            base = next((b for b in bases if name in vars(b)), None)
            if base is None or not callable(member) or name == "__init__":
                continue
            assert signature_of(member) == signature_of(vars(base)[name]), f"{cls.__name__}.{name}"
            checked.append(f"{cls.__name__}.{name}")
    assert {"XFlowApp.infer", "XFlowDICOMwebDatastore.get_label_uri", "XFlowLocalDatastore.save_label"} <= set(checked)


# --- the version range ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, supported",
    [
        ("0.8.5", True),
        ("0.8.5.post1", True),
        ("0.8.5+12.gabcdef", True),
        ("0.8.5rc2", False),
        ("0.8.4", False),
        ("0.8.6", False),
        ("0.9.0", False),
        ("1.0", False),
        ("weekly", False),
    ],
)
def test_the_supported_range(version, supported):
    assert wraps.is_supported(version) is supported


def test_the_installed_monailabel_is_supported():
    assert wraps.is_supported(wraps.monailabel_version())  # the pin of setup.cfg lies in the range


def test_the_app_refuses_to_start_on_another_monailabel(monkeypatch, tmp_path):
    from monailabel_xflow.app.xflow_app import XFlowApp

    monkeypatch.setattr(wraps, "monailabel_version", lambda: "0.9.1")
    monkeypatch.delenv(wraps.OVERRIDE_ENV, raising=False)
    with pytest.raises(wraps.UnsupportedMonaiLabelError) as refused:
        XFlowApp(str(tmp_path / "workspace"), str(tmp_path), {})
    message = str(refused.value)
    assert "MONAI Label 0.9.1 is installed" in message and ">=0.8.5,<0.8.6" in message
    assert "XFLOW_ALLOW_UNSUPPORTED_MONAILABEL=1" in message and "--conf allow_unsupported_monailabel true" in message
    assert not (tmp_path / "workspace").exists()  # refused before anything was written


def test_the_override_starts_it_anyway_with_a_warning(monkeypatch, tmp_path, caplog):
    from monailabel_xflow.app.xflow_app import XFlowApp
    from monailabel_xflow.errors import RequestError

    monkeypatch.setattr(wraps, "monailabel_version", lambda: "0.9.1")
    monkeypatch.delitem(sys.modules, "monailabel.app", raising=False)  # not a server: nothing is wrapped here
    with caplog.at_level(logging.WARNING, logger=wraps.__name__):
        assert wraps.check_monailabel({}, environ={wraps.OVERRIDE_ENV: "1"}) == "0.9.1"
        assert wraps.check_monailabel({wraps.OVERRIDE_CONF: "true"}, environ={}) == "0.9.1"
    assert "overridden: starting anyway" in caplog.text
    with pytest.raises(wraps.UnsupportedMonaiLabelError):
        wraps.check_monailabel({wraps.OVERRIDE_CONF: "false"}, environ={wraps.OVERRIDE_ENV: "0"})
    with pytest.raises(RequestError, match="allow_unsupported_monailabel"):
        wraps.check_monailabel({wraps.OVERRIDE_CONF: "maybe"}, environ={})
    monkeypatch.setenv("XFLOW_NO_DEMO", "1")  # the start, not the weights, is under test
    app = XFlowApp(str(tmp_path / "workspace"), str(tmp_path), {wraps.OVERRIDE_CONF: "true"})
    assert app.info()["name"] == "XFlow"


def test_the_real_server_exits_naming_the_range_on_another_monailabel(tmp_path):
    """``python -m monailabel.main start_server`` with the XFlow app, MONAI Label's metadata faked
    to 0.9.1 (a dist-info first on the path): the server exits, its output names the range and
    the override; it never serves."""
    from servers import REPO, ServerProcess, free_port, monailabel_env

    from monailabel_xflow.commands.serve import prepare_workspace, server_command

    fake = tmp_path / "fake-metadata" / "monailabel-0.9.1.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: monailabel\nVersion: 0.9.1\n")
    env = monailabel_env(tmp_path, {"XFLOW_NO_DEMO": "1"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(fake.parent), env.get("PYTHONPATH", "")) if p)
    workspace = prepare_workspace(tmp_path / "workspace")
    cmd = server_command(str(workspace), str(tmp_path), "127.0.0.1", free_port(), [], python=sys.executable)
    proc = ServerProcess(cmd, tmp_path / "monailabel.log", env=env, cwd=REPO)
    try:
        code = proc.proc.wait(300)
    finally:
        proc.stop()
    out = proc.log.read_text(errors="replace")
    assert code != 0, out[-3000:]
    assert "MONAI Label 0.9.1 is installed" in out and ">=0.8.5,<0.8.6" in out
    assert "XFLOW_ALLOW_UNSUPPORTED_MONAILABEL=1" in out


def test_the_settings_the_app_sets_and_the_datastore_attributes_it_reads_are_upstreams():
    """``server_defaults`` sets MONAI Label settings by name, and ``XFlowDICOMwebDatastore.list_images``
    reads upstream's ``_client`` and ``_search_filter``: a renamed one fails here."""
    from monailabel.config import settings
    from monailabel.datastore.dicom import DICOMWebDatastore

    from monailabel_xflow.app import server_defaults

    fields = type(settings).model_fields
    wanted = server_defaults.defaults("/tmp/app", current={k: f.default for k, f in fields.items()})
    assert set(wanted) == {
        "MONAI_LABEL_DICOMWEB_SEARCH_FILTER",
        "MONAI_LABEL_DICOMWEB_CACHE_EXPIRY",
        "MONAI_LABEL_DATASTORE_FILE_EXT",
        "MONAI_LABEL_SESSION_PATH",
        "MONAI_LABEL_DICOMWEB_CACHE_PATH",
    }
    assert set(wanted) <= set(fields)
    source = inspect.getsource(DICOMWebDatastore.__init__)
    assert "self._client = " in source and "self._search_filter = " in source
