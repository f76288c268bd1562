"""XFlow itself: Stage 1 grounding and boxes, Stage 2 click revision, answers (``xflow``); every
decision of a run as JSON and pictures (``trace``); which weights to load (``model_config``)."""
