"""Any π_rev behind the demo's Stage 1 (dev diagnostic, section 11 of README.md).

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

from monailabel_xflow.data.readers import read_mimic_ils
from monailabel_xflow.eval.phantom_benchmark import interleaved
from monailabel_xflow.eval.phantom_manifest import stage1_identity
from monailabel_xflow.eval.phantom_methods import SharedStage1, _Revisions
from monailabel_xflow.eval.phantom_protocol import STAGE1_NAME
from monailabel_xflow.eval.phantom_statistics import stop_decisions
from monailabel_xflow.transforms.loading import load_cxr
from monailabel_xflow.workflow.model_config import DEMO_MODELS_FILE, ModelConfig, load_models
from monailabel_xflow.workflow.xflow import XFlow

name, bench, out, rev_file = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
cfg = ModelConfig.load(DEMO_MODELS_FILE)
loaded = load_models(cfg)
flow = XFlow(
    SharedStage1(loaded.stage1, bench / STAGE1_NAME, stage1_identity(cfg)),
    load_models(ModelConfig.load(rev_file)).reviser,
    loaded.segmenter,
    max_clicks=cfg.max_clicks,
    models=loaded.identities,
)
cases = interleaved(
    read_mimic_ils(bench / "data" / "ground-truth" / "heldout.json", split="test", kinds=("basic", "global")).cases
)
folder = out / name
folder.mkdir(parents=True, exist_ok=True)
(folder / "revisions.jsonl").unlink(missing_ok=True)
revisions = _Revisions(folder / "revisions.jsonl")
for i, case in enumerate(cases):
    revisions.add(case.case_id, flow.run(load_cxr(case.image_path)[0], case.instruction).trace)
    if i % 50 == 0:
        print(i, flush=True)
print(name, json.dumps(stop_decisions(folder, bench / "oracle", cases)))
