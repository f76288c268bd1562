"""Any π_rev behind the demo's Stage 1 (dev diagnostic, section 11 of README.md; setup in
``replay.py``).

Stage 1 is the committed demo's, read from the Stage 1 texts of a finished
``xflow benchmark phantom ... --methods stage1,stage1+2,oracle`` folder BENCH made with the demo's
models file; Stage 2 is the π_rev (base and ``rev_adapter``, or ``rev_model``) of the models file
REV, with the demo's F_seg. Writes ``OUT/NAME/revisions.jsonl`` and prints ``stop_decisions``
against BENCH's oracle (mean IoU change per lesion against the ground truth).

    python reports/phantom-benchmark/dev-issue35/rev_behind_stage1.py NAME BENCH OUT REV
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from replay import demo_flow, replay

from monailabel_xflow.workflow.model_config import ModelConfig, load_models

name, bench, out, rev_file = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
_, _, flow = demo_flow(bench, load_models(ModelConfig.load(rev_file)).reviser)
print(name, json.dumps(replay(flow, bench, out / name)))
