"""Report structuring speed: reports per second of the rule-based structurer (medspaCy) and of
the LLM structurer's machinery, with the projected time for MIMIC-CXR's 377 K reports.

Run: ``.venv/bin/python benchmarks/bench_ils_reports.py [--n 400] [--llm-n 4]``.

* **rules**: section choice + structuring of ``--n`` phantom reports (as ``xflow phantom``
  writes them: headers, 4-8 sentences) on one core; pipeline construction (imports, rule
  compilation) is timed apart, as it is paid once per process.
* **llm**: the same reports through :class:`LLMStructurer` on a tiny random Gemma3 (2 layers,
  width 32) generating ``--max-new-tokens`` tokens: the cost of the prompt, chat template,
  generation loop and JSON validation, not of a real model (a 24 B model is ~10^6x the
  arithmetic). Its answers are invalid by construction, so each report costs ``retries + 1``
  generations; we run with ``retries=0``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import numpy as np  # noqa: E402
from common import parse_args  # noqa: E402

MIMIC_REPORTS = 377_110  # MIMIC-CXR v2 images; one report per study, fewer studies (227 K)


def _reports(n: int) -> list[str]:
    from monailabel_xflow.data.export import scheduled_findings
    from monailabel_xflow.data.phantom import generate_phantom
    from monailabel_xflow.data.phantom_reports import phantom_report

    # 16 small phantoms, many reports each (the text draw is what varies)
    phantoms = [generate_phantom(i, 128, findings=scheduled_findings(i, np.random.default_rng(i))) for i in range(16)]
    return [phantom_report(phantoms[k % 16], np.random.default_rng(k)).text for k in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--llm-n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = parse_args(ap, n=8, llm_n=1, max_new_tokens=2)
    import torch

    torch.set_num_threads(1)
    reports = _reports(a.n)
    words = sum(len(r.split()) for r in reports) / len(reports)

    from monailabel_xflow.ils import report as rep

    t0 = time.perf_counter()
    rep.structure_report(reports[0])  # builds the pipelines
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    n_tuples = sum(len(rep.structure_report(r)) for r in reports)
    dt = time.perf_counter() - t0
    rate = a.n / dt
    print(
        f"rules: pipelines built in {build:.1f} s; {a.n} reports ({words:.0f} words, {n_tuples / a.n:.1f} tuples "
        f"each) in {dt:.2f} s = {rate:.0f} reports/s on one core ({1000 * dt / a.n:.1f} ms each); "
        f"{MIMIC_REPORTS:,} reports: {MIMIC_REPORTS / rate / 60:.1f} min on one core"
    )

    if a.llm_n <= 0:
        return
    import tempfile

    from monailabel_xflow.ils.report_llm import load_llm_structurer, save_random_llm

    with tempfile.TemporaryDirectory() as d:
        save_random_llm(d)
        llm = load_llm_structurer(d, max_new_tokens=a.max_new_tokens, retries=0)
        t0 = time.perf_counter()
        for r in reports[: a.llm_n]:
            with contextlib.suppress(rep.ReportStructuringError):  # a random model never answers valid JSON
                rep.structure_report(r, llm)
        dt = time.perf_counter() - t0
    lrate = a.llm_n / dt
    print(
        f"llm (tiny random Gemma3, {a.max_new_tokens} new tokens, machinery only): {a.llm_n} reports in "
        f"{dt:.2f} s = {lrate:.2f} reports/s; rules are {rate / lrate:.0f}x faster even against this floor"
    )


if __name__ == "__main__":
    main()
