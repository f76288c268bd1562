"""The click-efficiency benchmark (``xflow benchmark clicks``): figures, the simulated user's
calls to F_seg, the anchors, resuming and the manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monailabel_xflow.eval import click_benchmark as cb
from monailabel_xflow.geometry import mask_to_box
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.testing import RecordingSegmenter, ScriptedSegmenter, disk


def test_noc_counts_clicks_until_the_threshold_and_caps_at_k_plus_one():
    assert cb.noc([0.5, 0.7, 0.86, 0.95], 0.85) == 2
    assert cb.noc([0.9, 0.2, 0.3], 0.85) == 0  # the box alone was enough
    assert cb.noc([0.5, 0.84, 0.849], 0.85) == 3  # never: K + 1 with K = 2
    assert cb.noc([0.5, 0.9, 0.5], 0.85) == 1  # first reach counts, a later drop does not


def _records(curves, findings=None, sizes=None, phantoms=None, method="fseg", prompt="box"):
    out = []
    for i, ious in enumerate(curves):
        out.append(
            {
                "component": f"{i:05d}/0/0",
                "phantom": phantoms[i] if phantoms else i,
                "finding": (findings or ["effusion"] * len(curves))[i],
                "size": (sizes or ["large"] * len(curves))[i],
                "method": method,
                "prompt": prompt,
                "ious": list(ious),
            }
        )
    return out


def test_summary_figures_on_constructed_curves():
    curves = [
        [0.5, 0.81, 0.86, 0.91],  # NoC@80 1, @85 2, @90 3
        [0.2, 0.3, 0.4, 0.5],  # never: 4 = K + 1
        [0.9, 0.9, 0.9, 0.9],  # at k = 0
        [0.6, 0.7, 0.82, 0.84],  # @80 2, @85/@90 never
    ]
    s = cb.summarise(
        _records(
            curves, findings=["effusion", "effusion", "edema", "edema"], sizes=["small", "large", "large", "small"]
        ),
        3,
    )
    assert s["noc_cap"] == 4 and s["components"] == 4 and s["phantoms"] == 4
    f = s["rows"]["fseg|box"]["figures"]
    assert f["iou@0"]["value"] == pytest.approx(np.mean([0.5, 0.2, 0.9, 0.6]))
    assert f["iou@3"]["value"] == pytest.approx(np.mean([0.91, 0.5, 0.9, 0.84]))
    assert f["noc@80"]["value"] == pytest.approx((1 + 4 + 0 + 2) / 4)
    assert f["noc@85"]["value"] == pytest.approx((2 + 4 + 0 + 4) / 4)
    assert f["noc@90"]["value"] == pytest.approx((3 + 4 + 0 + 4) / 4)
    assert f["reached@85"]["value"] == pytest.approx(2 / 4)
    assert f["gain"]["value"] == pytest.approx(np.mean([0.41, 0.3, 0.0, 0.24]))
    for fig in f.values():  # the interval holds the point
        assert fig["low"] <= fig["value"] + 1e-12 and fig["value"] <= fig["high"] + 1e-12
    eff = s["by_finding"]["fseg|box"]["effusion"]["figures"]
    assert s["by_finding"]["fseg|box"]["effusion"]["n"] == 2
    assert eff["noc@85"]["value"] == pytest.approx(3.0)
    assert s["by_size"]["fseg|box"]["small"]["figures"]["iou@3"]["value"] == pytest.approx((0.91 + 0.84) / 2)


def test_bootstrap_resamples_phantoms_not_components():
    # two phantoms; all components of one phantom share a value: resampling phantoms gives
    # replicate means that are only ever 0.2, 0.5 or 0.8
    curves = [[0.2, 0.2]] * 3 + [[0.8, 0.8]] * 3
    s = cb.summarise(_records(curves, phantoms=[0, 0, 0, 1, 1, 1]), 1)
    f = s["rows"]["fseg|box"]["figures"]["iou@1"]
    assert s["phantoms"] == 2
    assert f["value"] == pytest.approx(0.5)
    assert f["low"] == pytest.approx(0.2) and f["high"] == pytest.approx(0.8)


def test_summary_refuses_a_curve_of_another_length():
    with pytest.raises(cb.ClickBenchmarkError, match="expected 4"):
        cb.summarise(_records([[0.1, 0.2]]), 3)


def _object(shape=(128, 128)):
    return disk(shape, 64, 60, 22) | disk(shape, 64, 84, 14)


def test_fseg_curve_calls_the_segmenter_as_stage_2_does():
    gt = _object()
    inner = ScriptedSegmenter(gt, positive_radius_px=8, negative_radius_px=8)
    seg = RecordingSegmenter(inner)
    seg.set_image(np.zeros(gt.shape, np.float32))
    # a box that misses the right lobe: the user's clicks must go there
    box = mask_to_box(disk(gt.shape, 64, 60, 22))
    curve = cb.fseg_curve(seg, gt, "box", cb.make_clicker(3, 5.0))
    assert len(curve["ious"]) == 4
    calls = seg.calls
    assert calls[0].clicks is None and calls[0].previous is None  # k = 0: the true box alone
    assert calls[0].boxes == [mask_to_box(gt)]
    for t in range(1, len(calls)):
        # every click so far, and the previous call's low-res logits
        assert len(calls[t].clicks[0]) == t
        assert calls[t].clicks[0][: t - 1] == calls[t - 1].clicks[0][: t - 1] if t > 1 else True
        np.testing.assert_array_equal(calls[t].previous, calls[t - 1].result.low_res_logits[0:1])
    assert curve["ious"][0] == pytest.approx(mask_iou(calls[0].result.masks[0], gt))
    del box


def test_fseg_clicks_only_starts_from_the_empty_mask_and_a_point_box():
    gt = _object()
    seg = RecordingSegmenter(ScriptedSegmenter(gt, positive_radius_px=10, negative_radius_px=10))
    seg.set_image(np.zeros(gt.shape, np.float32))
    curve = cb.fseg_curve(seg, gt, "clicks", cb.make_clicker(4, 5.0))
    assert curve["ious"][0] == 0.0 and len(curve["ious"]) == 5
    first = seg.calls[0]
    (x1, y1, x2, y2) = first.boxes[0]
    c = first.clicks[0][0]
    assert c.positive and (x1, y1, x2, y2) == (c.x, c.y, c.x, c.y)
    assert first.previous is None
    assert curve["ious"][1] > 0  # the first positive click found the object
    assert curve["ious"][-1] > curve["ious"][1]


def test_client_prompt_sends_every_click_so_far_and_no_mask_as_slicer_and_ohif_do():
    from monailabel_xflow.workflow.xflow import revise_with_clicks

    gt = _object()
    image = np.zeros(gt.shape, np.float32)
    seg = RecordingSegmenter(ScriptedSegmenter(gt, positive_radius_px=10, negative_radius_px=10))
    seg.set_image(image)
    curve = cb.fseg_curve(seg, gt, "client", cb.make_clicker(4, 5.0), image=image)
    assert curve["ious"][0] == 0.0 and len(curve["ious"]) == 5
    assert len(seg.calls) == len(curve["clicks"]) >= 2
    for t, call in enumerate(seg.calls, start=1):
        assert len(call.clicks[0]) == t and call.previous is None  # a new request: no logits
    # each answer is the click tool's own for those clicks
    from monailabel_xflow.geometry import Click

    clicks = [Click(bool(p), x, y) for p, x, y in curve["clicks"]]
    again = revise_with_clicks(ScriptedSegmenter(gt, positive_radius_px=10, negative_radius_px=10), image, clicks)
    assert mask_iou(again.mask, gt) == pytest.approx(curve["ious"][len(clicks)])
    with pytest.raises(cb.ClickBenchmarkError, match="image"):
        cb.fseg_curve(seg, gt, "client", cb.make_clicker(2, 5.0))
    with pytest.raises(cb.ClickBenchmarkError, match="anchor"):
        cb.anchor_curve("watershed", image, gt, "client", cb.make_clicker(2, 5.0))


def test_anchor_masks_follow_their_seeds():
    img = np.full((96, 96), 0.2, np.float32)
    obj = disk(img.shape, 48, 48, 18)
    img[obj] = 0.8
    from monailabel_xflow.geometry import Click

    centre = Click(True, 48.5 / 96, 48.5 / 96)
    for method in cb.ANCHORS:
        assert not cb.anchor_mask(method, img, mask_to_box(obj), []).any()  # nothing to grow from
        with_box = cb.anchor_mask(method, img, (0.1, 0.1, 0.9, 0.9), [centre])
        assert mask_iou(with_box, obj) > 0.9
        no_box = cb.anchor_mask(method, img, None, [centre])  # inside a 24 px zoom window
        assert no_box.any() and (no_box & obj).sum() >= 0.9 * no_box.sum()
        assert not no_box[:, :30].any() and not no_box[:, 70:].any()
        wider = cb.anchor_mask(method, img, None, [centre], previous=obj)  # the window follows the mask
        assert mask_iou(wider, obj) > 0.9
        # a negative click carves: the pixel under it is background
        carved = cb.anchor_mask(method, img, (0.1, 0.1, 0.9, 0.9), [centre, Click(False, 40.5 / 96, 48.5 / 96)])
        assert not carved[48, 40]
    with pytest.raises(cb.ClickBenchmarkError, match="anchor"):
        cb.anchor_mask("grabcut", img, None, [centre])


def test_random_walker_iou_rises_with_the_users_clicks_on_a_phantom():
    image, components = cb.phantom_components(cb.DEV_SEED, 2, 128)
    comp = max(components, key=lambda c: c.area)
    curve = cb.anchor_curve("random-walker", image, comp.mask, "box", cb.make_clicker(6, 8.0))
    ious = curve["ious"]
    assert ious[0] == 0.0  # no seed yet
    assert ious[1] > 0.2
    assert max(ious[3:]) > ious[1] + 0.05
    assert curve["clicks"][0][0] is True  # the first click is positive, at the deepest pixel


def test_phantom_components_are_the_exported_phantoms_lesions():
    from monailabel_xflow.data.export import image_seed, scheduled_findings
    from monailabel_xflow.data.phantom import generate_phantom

    image, comps = cb.phantom_components(cb.DEV_SEED, 3, 128)
    s = image_seed(cb.DEV_SEED, 3)
    ph = generate_phantom(s, size=128, findings=scheduled_findings(3, np.random.default_rng(s)))
    assert image.shape == (128, 128) and image.dtype == np.float32
    assert {c.finding for c in comps} <= set(ph.findings)
    union = np.zeros((128, 128), bool)
    for c in comps:
        union |= c.mask
        assert c.size in {b for b, _, _ in cb.SIZE_BINS}
    lesions = np.zeros((128, 128), bool)
    for les in ph.lesions:
        lesions |= les.mask
    assert union.any() and not (union & ~lesions).any()


def test_size_bins_cover_the_unit_interval():
    assert cb.size_bin(0.0) == "small" and cb.size_bin(0.01) == "medium" and cb.size_bin(1.0) == "large"
    with pytest.raises(cb.ClickBenchmarkError):
        cb.size_bin(1.5)


@pytest.mark.parametrize("seed", [cb.TEST_SEED, *cb.SPENT_TEST_SEEDS])
def test_no_dev_choice_on_a_test_seed(tmp_path, seed):
    assert seed != cb.DEV_SEED
    with pytest.raises(cb.ClickBenchmarkError, match="test seed"):
        cb.run_click_benchmark(tmp_path / "clicks", None, seed=seed, methods=["watershed"], progress=False)
    assert not (tmp_path / "clicks").exists()


def test_run_resumes_and_guards_its_folder(tmp_path, monkeypatch):
    out = tmp_path / "clicks"
    kwargs = dict(phantoms=2, size=128, max_clicks=2, methods=["watershed"], progress=False, plots=True)
    summary = cb.run_click_benchmark(out, None, **kwargs)
    lines = (out / "results.jsonl").read_text().splitlines()
    n = summary["components"]
    assert len(lines) == 2 * n  # both prompts
    assert (out / "curve.png").stat().st_size > 0 and (out / "clicks.md").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["split"] == "dev" and manifest["seed"] == cb.DEV_SEED and manifest["test_seed"] == cb.TEST_SEED

    # an interrupted run: the last line lost; a rerun computes exactly that one again
    (out / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    calls = []
    real = cb.anchor_curve

    def counting(*args, **kw):
        calls.append(args[0])
        return real(*args, **kw)

    monkeypatch.setattr(cb, "anchor_curve", counting)
    again = cb.run_click_benchmark(out, None, **kwargs)
    assert len(calls) == 1
    assert len((out / "results.jsonl").read_text().splitlines()) == 2 * n
    assert again["rows"].keys() == summary["rows"].keys()
    assert again["rows"]["watershed|box"]["figures"]["iou@2"] == summary["rows"]["watershed|box"]["figures"]["iou@2"]

    # fewer phantoms of the same set: nothing recomputed, only the first phantom summarised
    fewer = cb.run_click_benchmark(out, None, **{**kwargs, "phantoms": 1})
    assert len(calls) == 1 and fewer["phantoms"] == 1 and fewer["components"] < n

    with pytest.raises(cb.ClickBenchmarkError, match="max_clicks"):
        cb.run_click_benchmark(out, None, **{**kwargs, "max_clicks": 3})
    with pytest.raises(cb.ClickBenchmarkError, match="seed"):
        cb.run_click_benchmark(out, None, **{**kwargs, "seed": 5})
    with pytest.raises(cb.ClickBenchmarkError, match="test split"):
        cb.run_click_benchmark(tmp_path / "t", None, split="test", seed=5, **kwargs)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"phantoms": 0}, "phantoms"),
        ({"size": 64}, "size"),
        ({"max_clicks": 17}, "max_clicks"),
        ({"methods": ["grabcut"]}, "unknown"),
        ({"prompts": []}, "unknown or no"),
        ({"split": "val"}, "split"),
        ({"methods": ["fseg"]}, "no segmenter"),
        ({"click_refinement": "magic"}, "click_refinement"),
    ],
)
def test_bad_arguments_are_refused(tmp_path, bad, match):
    with pytest.raises(cb.ClickBenchmarkError, match=match):
        cb.run_click_benchmark(tmp_path / "o", None, **{"phantoms": 1, "progress": False, **bad})


def test_tiny_sam3_end_to_end_through_the_cli(tmp_path, tiny_sam3, capsys):
    from monailabel_xflow.cli import main

    out = tmp_path / "b"
    # weights that are not there: a clear error, and no folder left to refuse the corrected rerun
    missing = ["benchmark", "clicks", "--out", str(out), "--segmenter", str(tmp_path / "typo"), "--phantoms", "1",
               "--methods", "fseg", "--no-progress", "--device", "cpu"]  # fmt: skip
    assert main(missing) == 2
    assert "not found" in capsys.readouterr().err and not out.exists()
    rc = main(
        [
            "benchmark",
            "clicks",
            "--out",
            str(out),
            "--segmenter",
            str(tiny_sam3),
            "--phantoms",
            "1",
            "--size",
            "128",
            "--max-clicks",
            "2",
            "--methods",
            "fseg",
            "--no-progress",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "F_seg, true box + clicks" in printed and "F_seg, clicks only" in printed
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert records and all(len(r["ious"]) == 3 and 0 <= min(r["ious"]) <= max(r["ious"]) <= 1 for r in records)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["segmenter"]["identity"] == cb.segmenter_identity(tiny_sam3)
    # another F_seg into the same folder is refused
    rc = main(["benchmark", "clicks", "--out", str(out), "--phantoms", "1", "--size", "128", "--max-clicks", "2",
               "--methods", "fseg", "--no-progress"])  # fmt: skip
    assert rc == 2 and "segmenter" in capsys.readouterr().err
    # the same weights with the click refinement are another F_seg: refused here, recorded in a new folder
    refined = ["--segmenter", str(tiny_sam3), "--phantoms", "1", "--size", "128", "--max-clicks", "2",
               "--methods", "fseg", "--prompts", "box", "--no-progress", "--device", "cpu",
               "--click-refinement", "brs"]  # fmt: skip
    assert main(["benchmark", "clicks", "--out", str(out), *refined]) == 2
    assert "segmenter" in capsys.readouterr().err
    assert main(["benchmark", "clicks", "--out", str(tmp_path / "brs"), *refined]) == 0
    manifest = json.loads((tmp_path / "brs" / "manifest.json").read_text())
    assert manifest["segmenter"]["click_refinement"] == "brs"


def test_zoom_window_expands_around_clicks_and_mask():
    from monailabel_xflow.geometry import Click

    shape = (200, 200)
    assert not cb.zoom_window(shape, [Click(False, 0.5, 0.5)]).any()  # no positive click, no mask
    w = cb.zoom_window(shape, [Click(True, 0.5025, 0.5025)])  # one click: a quarter of the side
    rows, cols = np.flatnonzero(w.any(1)), np.flatnonzero(w.any(0))
    assert 50 <= len(rows) <= 53 and 50 <= len(cols) <= 53 and w[100, 100]
    mask = np.zeros(shape, bool)
    mask[20:120, 60:80] = True  # 100 rows tall: 140 rows of window
    w = cb.zoom_window(shape, [Click(True, 0.35, 0.35)], mask)
    rows = np.flatnonzero(w.any(1))
    assert rows[0] == 1 and 138 <= rows[-1] <= 141 and w[mask].all()
    assert not w[0].any() and not w[:, 0].any()  # the border stays background
