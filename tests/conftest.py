"""Shared fixtures. Real radiographs come from ``tests/data/cxr`` (committed NIH PNGs) and DICOM
made from them (``radiographs.py``); nothing outside the repository is read."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def cxr_samples(tmp_path_factory) -> Path:
    """Folder of real radiographs (layout in ``radiographs.py``): the committed NIH PNGs and the
    CR / CR MONOCHROME1 / DX DICOM files made from them, written once per session."""
    from radiographs import make_samples

    return make_samples(tmp_path_factory.mktemp("radiographs"))


# --- tiny random models of the real architectures, built once per session ------------------------
# Tests only read these folders. A test that changes a model folder copies it first (shutil.copytree)
# or builds its own, so tests stay independent of each other and of their order.


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory):
    """Tiny random Gemma 3 (seed 0): ``base`` plus the π_init/π_rev LoRA adapters ``init`` and ``rev``.

    ``tiny_vlm.base`` is also what ``build_random_vlm(..., seed=0, adapters=False)`` writes: the
    base is saved before the adapters are made.
    """
    from monailabel_xflow.policy.configs import build_random_vlm

    return build_random_vlm(tmp_path_factory.mktemp("tiny-vlm"), "tiny", seed=0, adapters=True)


@pytest.fixture(scope="session")
def tiny_sam3(tmp_path_factory) -> Path:
    """Folder of a tiny random SAM3 tracker (seed 0, 1008 px input), loadable by ``load_segmenter``."""
    from monailabel_xflow.segmenter.configs import build_random_sam3

    return build_random_sam3(tmp_path_factory.mktemp("tiny-sam3") / "sam3", "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_rosalia(tmp_path_factory) -> Path:
    """Folder of a tiny random ROSALIA (seed 0)."""
    from monailabel_xflow.rosalia.configs import build_random_rosalia

    return build_random_rosalia(tmp_path_factory.mktemp("tiny-rosalia") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_models(tiny_vlm, tiny_sam3):
    """``make(folder) -> models.yaml``: a model configuration in ``folder`` naming the session's
    tiny VLM and SAM3 by relative paths (``./vlm/base``, ``./sam3``, as users write it), through
    symbolic links to the shared folders. The YAML is the caller's to append to."""
    from servers import write_models_yaml

    def make(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "vlm").symlink_to(tiny_vlm.base.parent, target_is_directory=True)
        (folder / "sam3").symlink_to(tiny_sam3, target_is_directory=True)
        return write_models_yaml(folder)

    return make


@pytest.fixture(autouse=True)
def _process_wide_state(monkeypatch):
    """Process-wide state restored after every test so none leaks into the next: the workspace
    store configured by an app created in-process (``XFlowApp``, ``xflow preannotate --store``),
    and torch's thread count, which the demo recipe sets (``demo_phases.set_threads``) and which
    changes float rounding, so a mask computed here could differ by a pixel from the server's."""
    import torch

    from monailabel_xflow.segmenter import store

    monkeypatch.setattr(store, "_default", store._default)
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def monailabel_settings(monkeypatch):
    """MONAI Label's ``settings`` as a fresh process reads them from the environment, for this test
    only: the app sets some when it is created in-process (``monailabel_xflow/app/server_defaults.py``),
    and whatever an earlier test or fixture of any scope left there must not decide this one."""
    from monailabel.config import settings

    fresh = type(settings)()
    for key in type(settings).model_fields:
        monkeypatch.setattr(settings, key, getattr(fresh, key))
    return settings
