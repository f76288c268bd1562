"""Datasets: procedural phantom radiographs and their reports (``phantom``, ``phantom_reports``),
written in the MIMIC-ILS release format (``export``, ``mimic_ils``); evaluation-set readers
(``readers``), the CheXpercept set (``chexpercept``) and DICOM SEG objects, the PACS's label
format (``seg``)."""

PHANTOM_SEEDS, PHANTOM_SET_SIZE = 10**9, 10**5
"""Phantom set seeds lie in ``0..PHANTOM_SEEDS - 1`` and sets hold at most ``PHANTOM_SET_SIZE``
studies, so that a study id (``export.study_ids``: ``s<seed>n<index>``) fits DICOM's 16 characters."""

PHANTOM_MIN_SIZE, PHANTOM_MAX_SIZE = 128, 4096
"""Image sides a phantom may have, in pixels (here, not in ``phantom``, so that the command line
can bound its options without importing SciPy): below 128 the anatomy does not resolve; a
4096-px phantom takes about a gigabyte to draw (the field reads radiographs at 256-1024 px)."""
