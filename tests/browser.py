"""A real browser for the OHIF tests: headless Chromium (Debian ``chromium``) driven by selenium
through ``chromedriver`` (Debian ``chromium-driver``), on loopback only (DESIGN §15).

Nothing here is a test. :func:`skip_without_chromium` is the marker the browser tests carry: a
machine without Chromium skips them with the reason, unless ``XFLOW_REQUIRE_BROWSER=1`` (set by
``.ci/run``), where a missing browser is a failure, so CI can never skip them silently.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SEG_ERRORS = (
    "not yet supported",
    "Aborting segmentation",
    "centroids",
    "Could not retrieve the segment index",
    "Failed to parse NRRD",
    "not an NRRD",
    "RecommendedDisplayCIELabValue not found",
    "Error loading SEG",
    "Failed to load Segmentation",
)
"""Console / page texts that mean a SEG or a panel result did not open."""


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).is_file():
            return f"{package} is not installed (apt-get install -y chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


def skip_without_chromium():
    """The marker of the browser tests (see the module docstring)."""
    reason = chromium_missing()
    if reason and os.environ.get("XFLOW_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"XFLOW_REQUIRE_BROWSER=1 but {reason}")
    return pytest.mark.skipif(reason is not None, reason=reason or "")


@contextlib.contextmanager
def chromium(width: int = 1200, height: int = 900) -> Iterator[Any]:
    """A headless Chromium session (no GPU: WebGL through SwiftShader; no QUIC, no background
    networking, a fresh profile), console logs kept; quit on exit."""
    import tempfile

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    profile = tempfile.TemporaryDirectory(prefix="xflow-chromium-")  # a fresh profile per session
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--enable-unsafe-swiftshader",
        "--disable-quic",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--force-device-scale-factor=1",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile.name}",
    ):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.console = []  # every console entry seen so far (get_log drains the browser's buffer)
    try:
        yield driver
    finally:
        driver.quit()
        profile.cleanup()


def console(driver) -> list[dict]:
    """All console entries of the session so far."""
    driver.console.extend(driver.get_log("browser"))
    return driver.console


def seg_errors(driver) -> list[str]:
    """Console entries and page text that say a SEG / panel result failed."""
    found = [e["message"] for e in console(driver) if any(k.lower() in e["message"].lower() for k in SEG_ERRORS)]
    body = driver.find_element("tag name", "body").text
    return found + [k for k in SEG_ERRORS if k.lower() in body.lower()]


def load_factor() -> float:
    """How much longer waits get on a loaded machine: the 1-minute load average per CPU, 1..4."""
    try:
        per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 1.0
    return min(4.0, max(1.0, per_cpu))


def wait_for(driver, condition, timeout: float = 60.0, what: str = "") -> Any:
    """Poll ``condition(driver)`` until truthy; fails the test with ``what`` and the page text.

    ``timeout`` (seconds) is what a quiet machine needs; it stretches by :func:`load_factor`
    (read when the wait starts) so a busy machine is given up to 4x as long.
    """
    timeout = timeout * load_factor()
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        with contextlib.suppress(Exception):
            value = condition(driver)
            if value:
                return value
        time.sleep(0.5)
    body = driver.find_element("tag name", "body").text[-1500:]
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; page text:\n{body}")


def wait_until_still(
    driver, timeout: float = 30.0, interval: float = 0.5, what: str = "the page to finish drawing"
) -> np.ndarray:
    """Wait until two screenshots ``interval`` seconds apart are identical (rendering, e.g. a
    labelmap drawn in chunks, has settled) instead of sleeping a fixed time; returns that
    screenshot (``uint8 (H, W, 3)``). Fails after ``timeout`` (stretched like :func:`wait_for`)."""
    shots = [screenshot(driver)]

    def settled(d) -> bool:
        time.sleep(interval)
        shots.append(screenshot(d))
        del shots[:-2]
        return bool(np.array_equal(shots[0], shots[1]))

    wait_for(driver, settled, timeout, what)
    return shots[-1]


WATCH_TEXTS_JS = """
const words = arguments[0];
window._xflowSeen = [];
const look = (node) => {
  const text = (node && node.textContent) || '';
  for (const w of words) if (text.includes(w) && !window._xflowSeen.includes(w)) window._xflowSeen.push(w);
};
new MutationObserver(ms => ms.forEach(m => { look(m.target); m.addedNodes.forEach(look); }))
  .observe(document.body, {childList: true, subtree: true, characterData: true});
"""


def watch_texts(driver, words: list[str]) -> None:
    """Record from now on which of ``words`` ever appear on the page (short-lived notifications
    that a slow poll would miss); read them back with :func:`seen_texts`."""
    driver.execute_script(WATCH_TEXTS_JS, list(words))


def seen_texts(driver) -> list[str]:
    """The words of :func:`watch_texts` that appeared, in order."""
    return list(driver.execute_script("return window._xflowSeen || []"))


def screenshot(driver) -> np.ndarray:
    """The page as ``uint8 (H, W, 3)`` RGB."""
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB"))


IMAGE_TO_PAGE_JS = """
const vp = window.cornerstone.getRenderingEngines()[0].getViewports()[0];
const img = vp.getImageData();
const rect = vp.getCanvas().getBoundingClientRect();
const p = [[0, 0, 0], [1, 0, 0], [0, 1, 0]].map(q => vp.worldToCanvas(img.imageData.indexToWorld(q)));
return {origin: [rect.left + p[0][0], rect.top + p[0][1]], di: [p[1][0] - p[0][0], p[1][1] - p[0][1]],
        dj: [p[2][0] - p[0][0], p[2][1] - p[0][1]], dims: img.dimensions, dpr: window.devicePixelRatio};
"""
"""Where the viewport draws image pixel (i = column, j = row): page ``origin + i*di + j*dj``."""


def image_to_page(driver) -> dict:
    """The first viewport's image -> page (CSS px) mapping (see :data:`IMAGE_TO_PAGE_JS`)."""
    return driver.execute_script(IMAGE_TO_PAGE_JS)


def sample_page(shot: np.ndarray, mapping: dict, mask_hw: np.ndarray) -> np.ndarray:
    """The screenshot's RGB at the page position of every ``True`` pixel of an image mask ``(H, W)``."""
    rows, cols = np.nonzero(mask_hw)
    o, di, dj, dpr = (np.asarray(mapping[k], float) for k in ("origin", "di", "dj", "dpr"))
    x = (o[0] + cols * di[0] + rows * dj[0]) * dpr
    y = (o[1] + cols * di[1] + rows * dj[1]) * dpr
    x = np.clip(np.round(x).astype(int), 0, shot.shape[1] - 1)
    y = np.clip(np.round(y).astype(int), 0, shot.shape[0] - 1)
    return shot[y, x].astype(int)


def tinted(rgb: np.ndarray, threshold: int = 24) -> np.ndarray:
    """Which RGB samples are coloured (a grey radiograph pixel has R = G = B)."""
    return (rgb.max(axis=-1) - rgb.min(axis=-1)) > threshold
