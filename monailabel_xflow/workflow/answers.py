"""XFlow's answers kept in the workspace store (:mod:`monailabel_xflow.segmenter.store`).

An answer is stored as the traces of one request (each holds the answer mask as RLE, the answer
sentence and every decision), so a stored answer rebuilds the same :class:`~.xflow.XFlowResult`
and the app writes the same label file byte for byte. What an answer depends on is its key:

* the store **namespace**: the segmenter's weights fingerprint (``Sam3Segmenter.fingerprint``),
  so promoting a trained segmenter wipes its answers with its embeddings;
* the **key**: the image content (``segmenter.base.image_key``), the segmenter's encode options
  (device, dtype, encode precision), the policies' weights fingerprints and generation settings,
  π_init's presence bias (``VLMPolicy.presence_bias``), the instructions in order, how they were
  asked (one ``run`` or a ``run_all`` batch), whether Stage 2 ran and, only then, the click
  budget, the pruning rule and the Stage 2 settings a models file sets besides the weights
  (:func:`revision_settings`).

A model without a fingerprint (a test double) is never stored: nothing else says its answers
are the same. A payload that does not read back as traces is ignored (logged) and recomputed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from monailabel_xflow.instructions import Instruction
from monailabel_xflow.segmenter.base import image_key
from monailabel_xflow.segmenter.store import ResultStore, default_store, digest
from monailabel_xflow.workflow.trace import Trace, TraceError

logger = logging.getLogger(__name__)

KIND = "ans"


def fingerprint_of(component: Any) -> str | None:
    """A component's weights fingerprint: its ``fingerprint`` attribute, else its ``model``'s
    weights (:func:`~monailabel_xflow.weights.weights_fingerprint`), else None."""
    if component is None:
        return "none"
    value = getattr(component, "fingerprint", None)
    if isinstance(value, str) and value:
        return value
    model = getattr(component, "model", None)
    if model is not None and hasattr(model, "state_dict"):
        from monailabel_xflow.weights import weights_fingerprint

        return weights_fingerprint(model)
    return None


def revision_settings(reviser: Any, segmenter: Any) -> dict[str, str]:
    """What shapes Stage 2's answers besides the weights and the decoding settings: π_rev's view
    and stop bias (``VLMPolicy.zoom``, ``stop_bias``) and the click refinement of the segmenter it
    clicks on (``stage2_click_refinement``; a zoom-in wrapper's inner segmenter holds it). A
    models file that changes one of them, with the same weights, gets answers of its own."""
    target = getattr(segmenter, "inner", segmenter)
    return {
        "zoom": repr(getattr(reviser, "zoom", None)),
        "stop_bias": repr(getattr(reviser, "stop_bias", None)),
        "refinement": repr(getattr(target, "refinement", None)),
    }


class AnswerKeys:
    """The names of one request's answers in a store (see the module docstring).

    Build with :meth:`of`, which returns None when the answers cannot be keyed safely.
    """

    def __init__(self, store: ResultStore, namespace: str, key: str) -> None:
        self.store = store
        self.namespace = namespace
        self.key = key

    @classmethod
    def of(
        cls,
        *,
        segmenter: Any,
        stage1: Any,
        reviser: Any,
        image: Any,
        instructions: Sequence[Instruction],
        mode: str,
        revise: bool,
        budget: int,
        prune: bool,
        store: ResultStore | None = None,
    ) -> AnswerKeys | None:
        """The names, or None (no store configured, or a model without a fingerprint)."""
        store = store if store is not None else default_store()
        if store is None or not getattr(segmenter, "persist", False):
            return None
        namespace = fingerprint_of(segmenter)
        policy = fingerprint_of(stage1)
        rev = fingerprint_of(reviser) if revise else "none"
        if namespace is None or policy is None or rev is None:
            return None
        key = digest(
            image_key(image),
            getattr(segmenter, "encode_options", {}),
            policy,
            repr(getattr(stage1, "generation", None)),
            repr(getattr(stage1, "presence_bias", None)),
            rev,
            repr(getattr(reviser, "generation", None)) if revise else None,
            revision_settings(reviser, segmenter) if revise else None,
            [i.to_dict() for i in instructions],
            mode,
            bool(revise),
            int(budget) if revise else None,
            bool(prune) if revise else None,
        )
        return cls(store, namespace, key)

    def load(self, count: int) -> list[Trace] | None:
        """The stored traces (``count`` of them), marked ``stored``; None when missing or unusable."""
        payload = self.store.get(self.namespace, KIND, self.key)
        if payload is None:
            return None
        try:
            raw = json.loads(payload.decode("utf-8"))
            if not isinstance(raw, list) or len(raw) != count:
                raise TraceError(f"expected {count} traces")
            traces = [Trace.from_dict(d) for d in raw]
        except (ValueError, TraceError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            logger.warning("stored answer %s unusable (%s); computing it again", self.key, exc)
            return None
        for t in traces:
            t.stored = {"key": self.key, "created": t.created}
        return traces

    def save(self, traces: Sequence[Trace]) -> bool:
        """Store the traces of one request (False when the store could not write them)."""
        payload = json.dumps([t.to_dict() for t in traces], separators=(",", ":")).encode("utf-8")
        return self.store.put(self.namespace, KIND, self.key, payload)

    def has(self) -> bool:
        return self.store.has(self.namespace, KIND, self.key)


def wipe_replaced(old: Any, new: Any, store: ResultStore | None = None) -> int:
    """Wipe the store's namespace of the segmenter ``old`` when ``new`` (a promoted, trained one)
    has other weights; returns the bytes freed (0 without a store or a fingerprint)."""
    store = store if store is not None else default_store()
    if store is None or not getattr(old, "persist", False):
        return 0
    before, after = fingerprint_of(old), fingerprint_of(new)
    if before is None or before == after:
        return 0
    return store.wipe(before)
