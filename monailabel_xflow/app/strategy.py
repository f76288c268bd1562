"""``xflow_uncertainty`` active-learning strategy: the unlabeled image XFlow is least sure about.

Returns ``{"id", "xflow_uncertainty", "fallback": False}`` for the highest ``xflow_uncertainty``
image info (:class:`~monailabel_xflow.app.scoring.XFlowUncertaintyScoring`) among images without a
``final`` label; none scored yet: a random unlabeled image (``"fallback": True``); none left: None.
The image handed out is passed to ``prefetch`` (the app's: :mod:`monailabel_xflow.workflow.prefetch`).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Mapping
from typing import Any

from monailabel_xflow.app.scoring import INFO_KEY

logger = logging.getLogger(__name__)


def _base_strategy() -> Any:
    from monailabel.interfaces.tasks.strategy import Strategy

    return Strategy


_Strategy: Any = _base_strategy()  # monailabel ships no type information: the base is Any to mypy


class XFlowUncertaintyStrategy(_Strategy):
    """Most uncertain unlabeled image first (see module docstring)."""

    def __init__(self, seed: int | None = None, prefetch: Callable[[str, Any], None] | None = None):
        super().__init__("XFlow uncertainty: most uncertain unlabeled image (random until scored)")
        self._random = random.Random(seed)
        self.prefetch = prefetch  # called with (image id, datastore) for the sample handed out

    def __call__(self, request: Mapping[str, Any], datastore: Any) -> dict[str, Any] | None:
        choice = self._choose(datastore)
        if choice is not None and self.prefetch is not None:
            try:
                self.prefetch(choice["id"], datastore)
            except Exception as exc:  # work ahead never fails a hand-out
                logger.warning("xflow_uncertainty: prefetch of %s not started: %s", choice["id"], exc)
        return choice

    def _choose(self, datastore: Any) -> dict[str, Any] | None:
        from monailabel.interfaces.datastore import DefaultLabelTag

        unlabeled = sorted(datastore.get_unlabeled_images(DefaultLabelTag.FINAL))
        if not unlabeled:
            logger.info("xflow_uncertainty: no unlabeled image left")
            return None
        scored = {}
        for image_id in unlabeled:
            value = (datastore.get_image_info(image_id) or {}).get(INFO_KEY)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                scored[image_id] = float(value)  # anything else (a hand-edited datastore file) is unscored
        if not scored:
            choice = self._random.choice(unlabeled)
            logger.info("xflow_uncertainty: no scores yet; random unlabeled image %s", choice)
            return {"id": choice, INFO_KEY: None, "fallback": True}
        choice = max(scored, key=lambda k: (scored[k], k))
        logger.info("xflow_uncertainty: %s (u = %.4f of %d scored)", choice, scored[choice], len(scored))
        return {"id": choice, INFO_KEY: scored[choice], "fallback": False}
