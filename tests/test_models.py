"""Model configuration: sources, validation, local-only resolution (never the network)."""

from __future__ import annotations

import json

import pytest

from monailabel_xflow.weights import is_hub_id, split_hub_id
from monailabel_xflow.workflow.model_config import ModelConfig, ModelConfigError, hub_ids


@pytest.fixture()
def folders(tmp_path):
    for name in ("base", "init", "rev", "sam"):
        (tmp_path / "models" / name).mkdir(parents=True)
    return tmp_path


def test_yaml_file_paths_resolve_against_its_folder(folders, monkeypatch):
    cfg_file = folders / "models" / "xflow.yaml"
    cfg_file.write_text("vlm_base: base\ninit_adapter: ./init\nrev_adapter: rev\nsegmenter: sam\nmax_clicks: 3\n")
    monkeypatch.chdir(folders)  # not the config's folder: resolution must not depend on it
    cfg = ModelConfig.from_file(cfg_file)
    cfg.validate()
    assert cfg.max_clicks == 3 and cfg.has_reviser
    assert cfg.resolve("vlm_base") == (folders / "models" / "base").resolve()
    assert cfg.resolve("init_adapter") == (folders / "models" / "init").resolve()
    assert hub_ids(cfg) == {}


def test_json_file_and_dict_sources(folders):
    data = {"init_model": str(folders / "models" / "base"), "segmenter": str(folders / "models" / "sam")}
    path = folders / "m.json"
    path.write_text(json.dumps(data))
    a, b = ModelConfig.load(path), ModelConfig.load(data)
    assert a.weights() == b.weights() == data
    assert not a.has_reviser
    a.validate()


def test_environment_overrides_the_file(folders):
    cfg_file = folders / "m.yaml"
    cfg_file.write_text("vlm_base: models/base\nsegmenter: models/sam\n")
    env = {
        "XFLOW_MODELS": str(cfg_file),
        "XFLOW_SEGMENTER": "org/sam3-cxr",
        "XFLOW_MAX_CLICKS": "2",
        "XFLOW_DEVICE": "",
    }
    cfg = ModelConfig.from_env(env)
    assert cfg.segmenter == "org/sam3-cxr" and cfg.max_clicks == 2 and cfg.device is None
    assert cfg.resolve("vlm_base") == (folders / "models" / "base").resolve()  # still relative to the file
    assert hub_ids(cfg) == {"segmenter": "org/sam3-cxr"}
    assert ModelConfig.from_env({}) == ModelConfig()


@pytest.mark.parametrize(
    "data, match",
    [
        ({}, "no policy model configured.*XFLOW_VLM_BASE"),
        ({"vlm_base": "a/b"}, "no segmenter configured.*XFLOW_SEGMENTER"),
        ({"vlm_base": "a/b", "init_model": "c/d", "segmenter": "e/f"}, "either vlm_base"),
        ({"init_model": "c/d", "rev_adapter": "x/y", "segmenter": "e/f"}, "adapters go with vlm_base"),
        ({"vlm_base": "a/b", "rev_model": "x/y", "segmenter": "e/f"}, "rev_model goes with init_model"),
    ],
)
def test_validate_says_what_to_configure(data, match):
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_dict(data).validate()


@pytest.mark.parametrize(
    "data, match",
    [
        ({"vlm_bsae": "x"}, "unknown model configuration key.*vlm_base"),
        ({"dtype": "float8"}, "dtype"),
        ({"segmenter_backend": "onnx"}, "segmenter_backend"),
        ({"max_clicks": -1}, "max_clicks"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_bad_values_are_refused(data, match):
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_dict(data)


def test_bad_files_are_refused(tmp_path):
    with pytest.raises(ModelConfigError, match="does not exist"):
        ModelConfig.from_file(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("vlm_base: [unclosed\n")
    with pytest.raises(ModelConfigError, match="cannot read"):
        ModelConfig.from_file(bad)
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match="mapping"):
        ModelConfig.from_file(listing)


def test_values_that_are_neither_paths_nor_hub_ids(tmp_path):
    cfg = ModelConfig(segmenter="./missing-folder", base_dir=str(tmp_path))
    with pytest.raises(ModelConfigError, match="not an existing path"):
        cfg.resolve("segmenter")
    with pytest.raises(ModelConfigError, match="not an existing path"):
        ModelConfig(segmenter="just-a-name").resolve("segmenter")
    with pytest.raises(ModelConfigError, match="not configured"):
        ModelConfig().resolve("segmenter")


def test_hub_ids_are_read_from_the_local_cache_only(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    calls = []

    def fake_snapshot_download(repo_id, revision=None, local_files_only=False, **kwargs):
        calls.append((repo_id, revision, local_files_only))
        if repo_id == "org/cached":
            return "/cache/org--cached/snapshots/abc"
        raise LocalEntryNotFoundError("not cached")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    cfg = ModelConfig(vlm_base="org/cached@v2", segmenter="org/absent")
    assert str(cfg.resolve("vlm_base")) == "/cache/org--cached/snapshots/abc"
    with pytest.raises(ModelConfigError, match="xflow weights pull"):
        cfg.resolve("segmenter")
    assert calls == [("org/cached", "v2", True), ("org/absent", None, True)]


def test_from_config_fails_fast_on_missing_weights(tmp_path):
    from monailabel_xflow.workflow.xflow import XFlow

    with pytest.raises(ModelConfigError, match="not an existing path"):
        XFlow.from_config({"vlm_base": str(tmp_path / "no-base"), "segmenter": str(tmp_path / "no-sam")})


def test_hub_id_helpers():
    assert is_hub_id("google/medgemma-1.5-4b-it") and is_hub_id("org/name@main")
    assert not is_hub_id("name") and not is_hub_id("/abs/path") and not is_hub_id("a/b/c")
    assert split_hub_id("org/name@v1.0") == ("org/name", "v1.0") and split_hub_id("org/name") == ("org/name", None)
