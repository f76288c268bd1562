"""ROSALIA, the single-shot baseline of the XFlow and MIMIC-ILS papers (LISA: LLaVA + SAM)."""
