"""Scoring answers: running an evaluation set and writing its reports (``evaluate``), the
papers' comparison on phantoms (``phantom_benchmark``, its parts in the ``phantom_*`` modules),
reader-study analysis (``reader_study``). The metrics themselves are :mod:`monailabel_xflow.metrics`."""
