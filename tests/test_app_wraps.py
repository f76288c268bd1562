"""The one way to wrap MONAI Label's functions (serving/patching.py; app/wraps.py lists them): layers stack,
never share a marker."""

from __future__ import annotations

import types

from monailabel_xflow.serving.patching import upstream, wrap, wrapped


def test_two_layers_stack_and_each_reaches_what_it_wrapped():
    module = types.SimpleNamespace(sample=lambda: "upstream")
    guard = lambda: "guard(" + upstream(module, "sample", "guard")() + ")"  # noqa: E731
    slicer = lambda: "slicer(" + upstream(module, "sample", "slicer")() + ")"  # noqa: E731
    assert wrap(module, "sample", "guard", guard)
    assert wrap(module, "sample", "slicer", slicer)
    assert module.sample() == "slicer(guard(upstream))"
    assert wrapped(module, "sample", "guard") and wrapped(module, "sample", "slicer")
    # installing again is a no-op for each layer: nothing wraps twice, nothing is hidden
    assert not wrap(module, "sample", "guard", guard) and not wrap(module, "sample", "slicer", slicer)
    assert module.sample() == "slicer(guard(upstream))"


def test_static_methods_stay_static_through_both_layers():
    class Task:
        @staticmethod
        def stop(method):
            return {"method": method, "details": []}

    def guarded(method):
        return {**upstream(Task, "stop", "guard")(method), "guarded": True}

    def with_details(method):
        out = upstream(Task, "stop", "slicer")(method)
        out["details"].append("stopped")
        return out

    wrap(Task, "stop", "guard", guarded, static=True)
    wrap(Task, "stop", "slicer", with_details, static=True)
    assert Task.stop("train") == {"method": "train", "details": ["stopped"], "guarded": True}
    assert Task().stop("train")["guarded"]  # still callable on an instance without self
    assert not wrapped(Task, "run", "guard")
