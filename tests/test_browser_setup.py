"""The browser and PACS tests cannot skip silently in CI: ``.ci/run`` installs Chromium,
chromedriver, Orthanc and its DICOMweb plugin from the Debian packages and sets
``XFLOW_REQUIRE_BROWSER=1`` and ``XFLOW_REQUIRE_ORTHANC=1``, under which a missing one is an error
instead of a skip. Elsewhere they skip with a reason that names the apt command."""

from __future__ import annotations

import re
from pathlib import Path

import browser
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ci_installs_chromium_and_requires_the_browser_tests():
    script = (ROOT / ".ci" / "run").read_text()
    assert "apt-get install" in script and " chromium chromium-driver" in script
    assert "export XFLOW_REQUIRE_BROWSER=1" in script
    assert script.index("XFLOW_REQUIRE_BROWSER=1") < script.index("make test")


@pytest.mark.parametrize("missing", ["chromium", "chromium-driver"])
def test_a_missing_browser_skips_with_the_reason_but_fails_when_required(monkeypatch, tmp_path, missing):
    """Whichever of the two packages is absent (this machine's own install does not matter)."""
    present = tmp_path / "present"
    present.write_text("")
    absent = str(tmp_path / "absent")
    monkeypatch.setattr(browser, "CHROMIUM", absent if missing == "chromium" else str(present))
    monkeypatch.setattr(browser, "CHROMEDRIVER", absent if missing == "chromium-driver" else str(present))
    monkeypatch.delenv("XFLOW_REQUIRE_BROWSER", raising=False)
    mark = browser.skip_without_chromium()
    reason = f"{missing} is not installed (apt-get install -y chromium chromium-driver)"
    assert mark.args[0] is True and mark.kwargs["reason"] == reason
    monkeypatch.setenv("XFLOW_REQUIRE_BROWSER", "1")
    with pytest.raises(RuntimeError, match=re.escape(f"XFLOW_REQUIRE_BROWSER=1 but {reason}")):
        browser.skip_without_chromium()


def test_ci_requires_orthanc_and_a_missing_one_skips_with_the_apt_command(monkeypatch, tmp_path):
    import servers

    script = (ROOT / ".ci" / "run").read_text()
    assert "apt-get install" in script and " orthanc orthanc-dicomweb" in script
    assert script.index("export XFLOW_REQUIRE_ORTHANC=1") < script.index("make test")
    monkeypatch.setattr(servers, "ORTHANC_PLUGIN", tmp_path / "absent.so")
    monkeypatch.delenv("XFLOW_REQUIRE_ORTHANC", raising=False)
    assert servers.orthanc_binary() is None
    monkeypatch.setenv("XFLOW_REQUIRE_ORTHANC", "1")
    with pytest.raises(RuntimeError, match=re.escape(servers.ORTHANC_APT)):
        servers.orthanc_binary()


@pytest.mark.parametrize("load,cpus,factor", [(0.5, 2, 1.0), (5.0, 2, 2.5), (40.0, 2, 4.0)])
def test_browser_waits_stretch_with_the_machine_load(monkeypatch, load, cpus, factor):
    """A wait given N seconds on a quiet machine gets up to 4 N on a loaded one (the OHIF panel test
    once timed out under load and passed on a quieter machine)."""
    monkeypatch.setattr(browser.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(browser.os, "cpu_count", lambda: cpus)
    assert browser.load_factor() == factor

    class Page:  # wait_for reads the page text only when it times out
        def find_element(self, *_):
            return type("Body", (), {"text": "page"})()

    monkeypatch.setattr(browser.time, "sleep", lambda s: None)
    clock = iter(range(0, 10_000))
    monkeypatch.setattr(browser.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(pytest.fail.Exception, match=f"timed out after {10 * factor:.0f} s"):
        browser.wait_for(Page(), lambda d: False, timeout=10, what="nothing")
