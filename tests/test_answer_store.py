"""XFlow's work kept in the workspace store (``workflow/answers.py``) and done ahead of the
annotator (``workflow/prefetch.py``), on the committed demo model."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from monailabel_xflow.instructions import all_findings
from monailabel_xflow.segmenter.cache import default_cache
from monailabel_xflow.segmenter.store import configure_store
from monailabel_xflow.transforms import load_cxr
from monailabel_xflow.workflow.model_config import DEMO_DIR, ModelConfig
from monailabel_xflow.workflow.prefetch import Prefetcher, autorun_steps
from monailabel_xflow.workflow.xflow import XFlow

SAMPLES = Path(__file__).resolve().parents[1] / "sample-data"


@pytest.fixture
def store(tmp_path):
    default_cache().clear()
    yield configure_store(tmp_path / "store", 256)
    configure_store(None)
    default_cache().clear()


def demo_flow() -> XFlow:
    return XFlow.from_config(ModelConfig.from_file(DEMO_DIR / "models.yaml"))


def image(n: int = 1) -> np.ndarray:
    return load_cxr(SAMPLES / f"phantom_1_0000{n}.png")[0]


def count_encodes(flow: XFlow) -> list[int]:
    """Counts calls of the segmenter model's image encoder from now on."""
    model = flow.segmenter.model
    calls = [0]
    inner = model.get_image_embeddings

    def counted(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    model.get_image_embeddings = counted
    return calls


def same(a, b) -> bool:
    return all(
        x.instruction == y.instruction
        and np.array_equal(x.mask, y.mask)
        and x.answer == y.answer
        and x.message == y.message
        and x.present == y.present
        for x, y in zip(a, b, strict=True)
    )


def test_a_stored_answer_is_what_a_fresh_run_answers_and_says_it_came_from_the_store(store):
    flow, img = demo_flow(), image()
    fresh = flow.run_all(img, revise=True, max_clicks=1)
    assert all(r.trace.stored is None for r in fresh) and any(r.present for r in fresh)
    again = flow.run_all(img, revise=True, max_clicks=1)
    assert same(fresh, again)
    assert all(r.trace.stored and r.trace.stored["created"] for r in again)
    assert all(r.trace.to_dict()["stored"]["key"] == again[0].trace.stored["key"] for r in again)
    # the Stage 1 only answers Slicer's Next Sample asks were kept on the way, and equal a fresh run
    derived = flow.run_all(img, revise=False)
    assert all(r.trace.stored for r in derived)
    configure_store(None)
    default_cache().clear()
    assert same(derived, demo_flow().run_all(img, revise=False))


def test_one_instruction_and_other_options_are_their_own_entries(store):
    flow, img = demo_flow(), image(2)
    instr = all_findings()[1]
    one = flow.run(img, instr, revise=False)
    assert one.trace.stored is None
    assert flow.run(img, instr, revise=False).trace.stored is not None
    assert flow.run(img, instr, revise=True, max_clicks=1).trace.stored is None  # Stage 2: another answer
    assert flow.run(img, instr, revise=True, max_clicks=1).trace.stored is not None
    assert flow.run(img, instr, revise=True, max_clicks=2).trace.stored is None  # another budget
    assert flow.run_all(img, revise=False, instructions=[instr])[0].trace.stored is None  # a batch is asked otherwise


def test_stage2_settings_of_the_models_file_are_their_own_entries(store):
    """The same weights with another Stage 2 setting (π_rev's stop bias, the refinement of its
    clicks) answer afresh: a restarted server must not serve answers made under the old setting.
    Stage 1 answers do not depend on them and are shared."""
    from dataclasses import replace

    config, img, instr = ModelConfig.from_file(DEMO_DIR / "models.yaml"), image(4), all_findings()[0]
    demo_flow().run(img, instr, revise=True, max_clicks=1)
    assert demo_flow().run(img, instr, revise=True, max_clicks=1).trace.stored is not None
    for changed in ({"stage2_stop_bias": 0.25}, {"stage2_click_refinement": "brs"}):
        flow = XFlow.from_config(replace(config, **changed))
        assert flow.run(img, instr, revise=True, max_clicks=1).trace.stored is None, changed
        assert flow.run(img, instr, revise=False).trace.stored is not None, changed  # Stage 1's answer


def test_another_presence_bias_is_its_own_entry(store):
    """π_init's presence bias changes Stage 1's answers: the same weights under another bias answer
    afresh, with or without Stage 2."""
    from dataclasses import replace

    config, img, instr = ModelConfig.from_file(DEMO_DIR / "models.yaml"), image(4), all_findings()[0]
    demo_flow().run(img, instr, revise=False)
    assert demo_flow().run(img, instr, revise=False).trace.stored is not None
    flow = XFlow.from_config(replace(config, stage1_presence_bias=config.stage1_presence_bias - 1.0))
    assert flow.run(img, instr, revise=False).trace.stored is None
    assert flow.run(img, instr, revise=False).trace.stored is not None


def test_a_corrupt_stored_answer_is_recomputed_never_served(store):
    flow, img = demo_flow(), image(3)
    fresh = flow.run_all(img, revise=False)
    entries = list((store.root).rglob("ans/*/*"))
    assert entries
    for path in entries:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])  # a write cut short
    again = flow.run_all(img, revise=False)
    assert all(r.trace.stored is None for r in again) and same(fresh, again)
    assert store.corrupt >= 1
    assert all(r.trace.stored for r in flow.run_all(img, revise=False))  # written again, whole


def test_a_click_after_a_restart_needs_no_encode(store):
    img = image(4)
    demo_flow().run_all(img, revise=False)
    default_cache().clear()  # a new process: nothing in memory
    flow = demo_flow()
    calls = count_encodes(flow)
    res = flow.revise(img, [], box=(0.1, 0.1, 0.5, 0.9))
    assert calls[0] == 0 and res.mask.shape == img.shape
    assert all(r.trace.stored for r in flow.run_all(img, revise=False))
    # the check can fail: without the store the same click encodes
    configure_store(None)
    default_cache().clear()
    flow.revise(img, [], box=(0.1, 0.1, 0.5, 0.9))
    assert calls[0] == 1


def test_promoting_another_segmenter_wipes_the_replaced_weights_entries(store):
    import torch

    from monailabel_xflow.segmenter.loading import load_segmenter

    flow, img = demo_flow(), image(1)
    flow.run_all(img, revise=False)
    old = flow.segmenter.fingerprint
    assert store.namespaces() == [old]
    trained = load_segmenter(DEMO_DIR / "segmenter", device="cpu")
    with torch.no_grad():
        next(trained.model.parameters()).add_(0.01)  # other weights (a fresh object: fingerprinted now)
    flow.replace_segmenter(trained)
    assert store.namespaces() == []
    assert all(r.trace.stored is None for r in flow.run_all(img, revise=False))
    assert store.namespaces() == [trained.fingerprint] and trained.fingerprint != old


def test_prepare_keeps_the_auto_run_answer_and_prefetch_runs_it_in_the_background(store):
    flow, img = demo_flow(), image(2)
    assert not flow.has_answer(img, revise=False)
    prefetcher = Prefetcher()
    job = prefetcher.submit("phantom_1_00002", autorun_steps(lambda: flow, lambda: img))
    assert job.done.wait(300) and job.error is None and job.completed == [0, 1, 2]
    assert flow.has_answer(img, revise=False)
    calls = count_encodes(flow)
    assert all(r.trace.stored for r in flow.run_all(img, revise=False)) and calls[0] == 0
    prefetcher.close(5)


def test_prefetch_runs_one_job_at_a_time_cancels_superseded_ones_and_lowers_its_priority():
    prefetcher = Prefetcher(nice=5)
    log: list[str] = []
    gate, running = threading.Event(), threading.Event()

    def step(name: str, wait: bool = False):
        def run() -> None:
            if wait:
                running.set()
                assert gate.wait(30)
            log.append(name)

        return run

    niceness: list[int] = []

    def nice_of_worker() -> None:
        stat = Path(f"/proc/self/task/{threading.get_native_id()}/stat").read_text()
        niceness.append(int(stat.rsplit(")", 1)[1].split()[16]))

    first = prefetcher.submit("a", [nice_of_worker, step("a1", wait=True), step("a2")])
    assert running.wait(30)
    second = prefetcher.submit("b", [step("b1"), step("b2")])
    third = prefetcher.submit("c", [step("c1")])  # supersedes b before it starts, and a while it runs
    assert prefetcher.submit("c", [step("c-dup")]) is third  # the same image again: no second job
    gate.set()
    assert third.done.wait(30) and first.done.wait(30) and second.done.wait(30)
    assert log == ["a1", "c1"]  # a stopped after its running step, b never ran
    assert first.completed == [0, 1] and second.completed == []
    assert niceness and niceness[0] >= os.nice(0) + 5
    prefetcher.close(5)
    with pytest.raises(RuntimeError):
        prefetcher.submit("d", [])
    time.sleep(0)
