"""OHIF's MONAI Label panel against the real server, in a real headless Chromium (issue 16, 5b/5c).

One Orthanc and one MONAI Label server (tiny random models of the real architectures, generation
capped so that "all findings" stays quick) for the module; the PACS holds one CR phantom. The
panel lives in the "MONAI Label" mode, which OHIF disables for CR/DX in its study list (it
accepts CT/MR); it is reached by its URL, switched to a 1x1 layout, pointed at the test server
through its ``MONAILABEL_SERVER_URL`` cookie, and used as an annotator would: connect, pick
``xflow``, Run.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
from browser import (
    chromium,
    console,
    seen_texts,
    seg_errors,
    skip_without_chromium,
    wait_for,
    wait_until_still,
    watch_texts,
)
from servers import monailabel_server, orthanc_binary, orthanc_server, orthanc_upload

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        orthanc_binary() is None, reason="Orthanc is not installed (apt-get install -y orthanc orthanc-dicomweb)"
    ),
    skip_without_chromium(),
]


@pytest.fixture(scope="module")
def panel(tmp_path_factory, tiny_models):
    from test_ohif_viewer import phantom_cr

    tmp = tmp_path_factory.mktemp("panel")
    phantom_cr(tmp / "phantom.dcm")
    import pydicom

    study = str(pydicom.dcmread(tmp / "phantom.dcm", stop_before_pixels=True).StudyInstanceUID)
    models = tiny_models(tmp / "models")
    models.write_text(models.read_text() + "max_new_tokens: 24\n")  # random weights never stop by themselves
    with orthanc_server(tmp / "orthanc") as orthanc:
        orthanc_upload(orthanc, tmp / "phantom.dcm")
        with monailabel_server(f"{orthanc}/dicom-web", tmp / "server", conf={"models": str(models)}) as server:
            t0 = time.perf_counter()
            with chromium() as d:
                d.get(f"{server.url}/ohif/")
                d.add_cookie({"name": "MONAILABEL_SERVER_URL", "value": f"{server.url}/"})
                d.get(f"{server.url}/ohif/monai-label?StudyInstanceUIDs={study}")
                wait_for(d, lambda d: d.find_element("id", "monailabelServerURL"), 90, "the MONAI Label panel")
                for button in d.find_elements("xpath", "//button[contains(., 'Confirm and Hide')]"):
                    button.click()
                yield SimpleNamespace(driver=d, server=server, study=study, tmp=tmp, t0=t0)


def test_panel_connects_and_lists_xflow(panel):
    d = panel.driver
    url = d.find_element("id", "monailabelServerURL")
    assert url.get_attribute("value") == f"{panel.server.url}/"
    url.find_element("xpath", "ancestor::tr[1]//button").click()  # connect
    select = wait_for(
        d,
        lambda d: d.find_element("xpath", "//select[option[normalize-space()='xflow']]"),
        60,
        "the model list with xflow",
    )
    models = [o.text.strip() for o in select.find_elements("tag name", "option")]
    assert models[0] == "xflow" and "xflow_revise" not in models, models  # xflow_revise: a point-prompt model
    assert any("GET:: " in e["message"] and "/info/" in e["message"] for e in console(d))
    # the point-prompt (deepedit) model, with the findings as the labels to click for
    d.find_element("xpath", "//*[normalize-space(text())='Point Prompts']").click()
    wait_for(
        d,
        lambda d: d.find_element("xpath", "//select[option[normalize-space()='xflow_revise']]"),
        30,
        "xflow_revise under Point Prompts",
    )
    wait_for(
        d,
        lambda d: all(f in d.find_element("tag name", "body").text for f in ("edema", "effusion", "cardiomegaly")),
        30,
        "the findings as the point prompts' labels",
    )
    # the options dialog offers xflow's options, store_seg among them (the README's workaround)
    d.find_element("xpath", "//*[normalize-space(text())='Options / Configurations']").click()
    wait_for(
        d,
        lambda d: d.find_element("xpath", "//*[normalize-space(text())='store_seg']"),
        30,
        "store_seg in the options dialog",
    )
    for option in ("instruction", "finding", "location", "max_clicks", "result_extension"):
        assert (option in d.find_element("tag name", "body").text) == (option != "result_extension"), option
    d.find_element("xpath", "//button[normalize-space()='Cancel']").click()


def test_panel_auto_segmentation_gets_a_file_it_parses(panel):
    """Run on the CR in a 1x1 layout: the panel's request (``.nrrd``, ``uint8``, ``output=image``,
    no instruction) is answered 200 with an NRRD the panel parses; what happens after the parse
    (painting into a volume labelmap) is upstream's and is recorded, not asserted."""
    from selenium.webdriver.common.action_chains import ActionChains

    d = panel.driver
    d.execute_script("window.commandsManager.runCommand('setViewportGridLayout', {numRows: 1, numCols: 1})")
    thumb = wait_for(d, lambda d: d.find_element("xpath", "//*[normalize-space(text())='CHEST AP']"), 30, "the CR")
    ActionChains(d).double_click(thumb).perform()
    wait_for(
        d,
        lambda d: d.execute_script(
            "const e = window.cornerstone.getRenderingEngines()[0];"
            "return e.getViewports().length === 1 && e.getViewports()[0].getImageData();"
        ),
        90,
        "the CR in a 1x1 layout",
    )
    t0 = time.perf_counter()
    auto = d.find_element(
        "xpath", "//select[option[normalize-space()='xflow'] and not(option[normalize-space()='xflow_revise'])]"
    )
    if not auto.is_displayed():  # the sections are an accordion: open Auto-Segmentation
        d.find_element("xpath", "//*[normalize-space(text())='Auto-Segmentation']").click()
        wait_for(d, lambda d: auto.is_displayed(), 10, "the Auto-Segmentation section")
    from selenium.webdriver.support.select import Select

    Select(auto).select_by_visible_text("xflow")  # beside it: rosalia, the baseline
    watch_texts(d, ["Running Segmentation - Successful", "Failed to Run Segmentation"])  # 4 s notifications
    auto.find_element("xpath", "following::button[normalize-space()='Run'][1]").click()
    text = wait_for(d, lambda d: next(iter(seen_texts(d)), None), 300, "the panel's answer")
    seconds = time.perf_counter() - t0
    shot = wait_until_still(d)
    out = os.environ.get("XFLOW_OHIF_SCREENSHOTS")
    if out:
        from PIL import Image

        os.makedirs(out, exist_ok=True)
        Image.fromarray(shot).save(os.path.join(out, "ohif-panel-auto-segmentation.png"), optimize=True)
    logs = [e["message"] for e in console(d)]
    posted = [m for m in logs if "POST:: " in m and "/infer/xflow" in m]
    after = [m for m in logs if "UpdateView" in m or "Error" in m or "error" in m][-5:]
    print(
        f"\npanel auto-segmentation answered in {seconds:.1f} s ({text}); "
        f"browser session {time.perf_counter() - panel.t0:.1f} s; after the parse: {after}"
    )
    assert text == "Running Segmentation - Successful"
    assert posted and "output=image" in posted[-1]
    assert not [e for e in seg_errors(d) if "NRRD" in e], seg_errors(d)
    server_log = panel.server.proc.log.read_text()
    assert "'result_extension': '.nrrd'" in server_log and "Segment the effusion." in server_log  # all findings
