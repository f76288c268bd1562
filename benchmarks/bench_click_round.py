"""One click round through the server: what a 3D Slicer annotator waits for per click.

Starts the real MONAI Label server (``tests/servers.py``) with the committed demo models on the
``sample-data`` phantoms and replays the simulated annotator of ``tests/test_human_clicks.py``
(the click benchmark's user) on lesions of those phantoms, each click sent as the Slicer module
sends it (``label``, ``foreground``, ``background``: every click so far, NRRD back) through MONAI
Label's Python client. Timed per request as the client sees it:

* **first click** on an image (the server loads the image and runs F_seg's encoder);
* **later clicks** (the embedding is cached: loading, one decoder call, writing the label);
* **in process**: the same clicks answered by :func:`~monailabel_xflow.workflow.xflow.revise_with_clicks`
  on the same F_seg, set as the demo's models file sets it (its ``click_refinement``), with its
  embedding cached (the decoder, the refinement and the click rule only), so the ratio
  later-click / in-process is what the server adds around the model;
* **in process, unrefined**: the same without the click refinement (``segmenter/refine.py``), so
  in-process / unrefined is what the refinement costs per click.

Usage: ``.venv/bin/python benchmarks/bench_click_round.py [--lesions 6] [--clicks 4] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from common import parse_args  # noqa: E402
from servers import monailabel_server  # noqa: E402
from test_human_clicks import LESIONS, SAMPLE, lesion_truth, slicer_answer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lesions", type=int, default=len(LESIONS), help=f"lesions (1-{len(LESIONS)})")
    parser.add_argument("--clicks", type=int, default=4, help="clicks per lesion (default 4)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parse_args(parser, lesions=1, clicks=2)

    from types import SimpleNamespace

    from monailabel_xflow.policy.oracle import simulated_user
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.segmenter.refine import refinement_for
    from monailabel_xflow.transforms.loading import load_cxr
    from monailabel_xflow.workflow.model_config import DEMO_DIR, demo_config
    from monailabel_xflow.workflow.xflow import revise_with_clicks

    lesions = LESIONS[: max(1, min(args.lesions, len(LESIONS)))]
    first, later, local, unrefined = [], [], [], []
    demo = demo_config()
    assert demo is not None
    refinement = refinement_for(demo.click_refinement)
    seg = load_segmenter(str(DEMO_DIR / "segmenter"), device="cpu", refinement=refinement)
    plain = load_segmenter(str(DEMO_DIR / "segmenter"), device="cpu")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        studies = tmp / "studies"
        studies.mkdir()
        for study, _ in lesions:
            shutil.copy(SAMPLE / f"{study}.png", studies)
        with monailabel_server(studies, tmp / "server") as running:
            client = running.client(tmp)
            server = SimpleNamespace(client=client, info=client.info(), studies=studies, url=running.url, tmp=tmp)
            for study, finding in lesions:
                truth = lesion_truth(study, finding)
                image, _ = load_cxr(SAMPLE / f"{study}.png")
                user = simulated_user(args.clicks)
                mask = np.zeros_like(truth)
                clicks = []
                for k in range(args.clicks):
                    click = user.next_click(mask, truth, clicks)
                    if click is None:
                        break
                    clicks.append(click)
                    start = time.perf_counter()
                    mask = slicer_answer(server, study, finding, clicks, truth.shape)
                    (first if k == 0 else later).append(time.perf_counter() - start)
                    revise_with_clicks(seg, image, clicks)  # embedding cached from here on
                    start = time.perf_counter()
                    revise_with_clicks(seg, image, clicks)
                    local.append(time.perf_counter() - start)
                    revise_with_clicks(plain, image, clicks)
                    start = time.perf_counter()
                    revise_with_clicks(plain, image, clicks)
                    unrefined.append(time.perf_counter() - start)

    def ms(values):
        return round(1000 * float(np.median(values)), 1) if values else None

    figures = {
        "segmenter_input_px": int(plain.input_size),
        "click_refinement": demo.click_refinement,
        "lesions": len(lesions),
        "first_click_ms": ms(first),
        "later_click_ms": ms(later),
        "in_process_click_ms": ms(local),
        "in_process_unrefined_click_ms": ms(unrefined),
        "later_over_in_process": round(ms(later) / ms(local), 2) if later and local else None,
        "refined_over_unrefined": round(ms(local) / ms(unrefined), 2) if local and unrefined else None,
        "requests": len(first) + len(later),
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
