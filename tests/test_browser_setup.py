"""The browser tests cannot skip silently in CI (issue 16): ``.ci/run`` installs Chromium and
chromedriver from the Debian packages and sets ``XFLOW_REQUIRE_BROWSER=1``, under which a missing
browser is an error instead of a skip."""

from __future__ import annotations

from pathlib import Path

import browser
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ci_installs_chromium_and_requires_the_browser_tests():
    script = (ROOT / ".ci" / "run").read_text()
    assert "apt-get install" in script and " chromium chromium-driver" in script
    assert "export XFLOW_REQUIRE_BROWSER=1" in script
    assert script.index("XFLOW_REQUIRE_BROWSER=1") < script.index("make test")


def test_a_missing_browser_skips_with_the_reason_but_fails_when_required(monkeypatch, tmp_path):
    monkeypatch.setattr(browser, "CHROMEDRIVER", str(tmp_path / "no-chromedriver"))
    monkeypatch.delenv("XFLOW_REQUIRE_BROWSER", raising=False)
    mark = browser.skip_without_chromium()
    assert mark.args[0] is True and "chromium-driver is not installed" in mark.kwargs["reason"]
    monkeypatch.setenv("XFLOW_REQUIRE_BROWSER", "1")
    with pytest.raises(RuntimeError, match="XFLOW_REQUIRE_BROWSER=1 but chromium-driver is not installed"):
        browser.skip_without_chromium()
