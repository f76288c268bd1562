"""What a server of XFlow needs whatever web framework serves it: the ASGI guard around every
request (:mod:`.asgi`) and the one answering pipeline of an instruction request (:mod:`.answering`).
The MONAI Label app (:mod:`monailabel_xflow.app`) adapts these to MONAI Label."""
