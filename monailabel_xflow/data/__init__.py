"""Datasets: procedural phantom radiographs and their reports (``phantom``, ``phantom_reports``),
written in the MIMIC-ILS release format (``export``, ``mimic_ils``); evaluation-set readers
(``readers``), the CheXpercept set (``chexpercept``) and DICOM SEG objects, the PACS's label
format (``seg``)."""
