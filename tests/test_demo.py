"""The demo model: the committed default and its recipe (monailabel_xflow/training/demo.py).

* the committed demo (``monailabel_xflow/demo/``) is the default when nothing is configured,
  says it is a phantom-only demo, and answers a question on a sample-data radiograph;
* the recipe runs end to end at a toy scale and writes a model folder that loads;
* the held-out set builder balances levels and signs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from monailabel_xflow.instructions import parse_instruction
from monailabel_xflow.segmenter.refine import ClickRefinement
from monailabel_xflow.workflow.model_config import (
    DEMO_DIR,
    DEMO_MODELS_FILE,
    DEMO_NAME,
    DEMO_NOTICE,
    ModelConfig,
    default_config,
    demo_config,
)

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample-data"

needs_demo = pytest.mark.skipif(not DEMO_MODELS_FILE.is_file(), reason="demo weights not installed")


def _sample_image() -> Path:
    return sorted(SAMPLE.glob("phantom_*.png"))[0]


# --- the committed demo -----------------------------------------------------------------------


def test_notice_names_the_demo_and_says_it_is_not_clinical():
    assert DEMO_NAME in DEMO_NOTICE
    assert "synthetic phantoms" in DEMO_NOTICE and "not for clinical images" in DEMO_NOTICE


@needs_demo
def test_committed_demo_is_small_and_complete():
    files = [p for p in DEMO_DIR.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 25 * 2**20
    for rel in (
        "base/config.json",
        "base/model.safetensors",
        "base/tokenizer.json",
        "init/adapter_config.json",
        "init/adapter_model.safetensors",
        "rev/adapter_config.json",
        "rev/adapter_model.safetensors",
        "segmenter/config.json",
        "segmenter/model.safetensors",
        "models-stage1.yaml",
        "README.md",
    ):
        assert (DEMO_DIR / rel).is_file(), rel
    assert "not for clinical images" in (DEMO_DIR / "README.md").read_text()


@needs_demo
def test_demo_is_the_default_only_when_nothing_is_configured(tmp_path):
    cfg = demo_config()
    assert cfg is not None and cfg.is_demo and cfg.has_reviser
    cfg.validate()
    assert cfg.identities()["demo"] == DEMO_NOTICE

    config, source = default_config({})
    assert source == "demo" and config.is_demo
    # settings from the environment still apply on top of the demo
    config, _ = default_config({"XFLOW_MAX_CLICKS": "2"})
    assert config.is_demo and config.max_clicks == 2
    # any configured weights win; XFLOW_NO_DEMO turns the fallback off
    config, source = default_config({"XFLOW_SEGMENTER": str(tmp_path)})
    assert not config.is_demo and source == "XFLOW_*" and "demo" not in config.identities()
    config, _ = default_config({"XFLOW_NO_DEMO": "1"})
    assert config == ModelConfig()


@needs_demo
def test_demo_answers_on_a_sample_image(monkeypatch, caplog):
    from monailabel_xflow.transforms import load_cxr
    from monailabel_xflow.workflow.xflow import XFlow

    for key in [k for k in os.environ if k.startswith("XFLOW_")]:
        monkeypatch.delenv(key)
    with caplog.at_level("WARNING", logger="monailabel_xflow.workflow.model_config"):
        flow = XFlow.from_config(None)  # nothing configured: the demo
    assert DEMO_NOTICE in caplog.text
    image, _ = load_cxr(_sample_image())
    result = flow.run(image, "Segment the effusion in the left lung.")
    assert result.mask.shape == image.shape and result.mask.dtype == bool
    assert isinstance(result.message, str) and result.message.endswith(".")
    assert result.trace is not None


@needs_demo
def test_segment_cli_uses_the_demo_by_default(tmp_path, monkeypatch):
    from monailabel_xflow.cli import main

    for key in [k for k in os.environ if k.startswith("XFLOW_")]:
        monkeypatch.delenv(key)
    rc = main(
        ["segment", str(_sample_image()), "--instruction", "Segment the pneumonia.", "--out", str(tmp_path / "o"), "-q"]
    )
    assert rc == 0
    assert any(tmp_path.joinpath("o").rglob("*.png"))


# --- the recipe --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quick_model(tmp_path_factory):
    from monailabel_xflow.training.demo import main

    out = tmp_path_factory.mktemp("demo")
    rc = main(
        [
            "--quick",
            "--out",
            str(out),
            "--no-progress",
            "--set",
            "rl_steps_rev=0",
            "--set",
            "rev_components=2",
            "--set",
            "seg_eval=1",
        ]
    )
    assert rc == 0
    return out / "model"


def test_quick_recipe_writes_a_loadable_model(quick_model):
    from monailabel_xflow.transforms import load_cxr
    from monailabel_xflow.workflow.xflow import XFlow

    for rel in (
        "models.yaml",
        "models-stage1.yaml",
        "recipe.json",
        "README.md",
        "base/config.json",
        "init/adapter_config.json",
        "rev/adapter_config.json",
        "segmenter/config.json",
    ):
        assert (quick_model / rel).is_file(), rel
    info = json.loads((quick_model / "recipe.json").read_text())
    assert set(info["phases_seconds"]) >= {"vision-pretrain", "init-sft", "rev-sft", "init-rl", "total"}
    assert any(k.startswith("segmenter") for k in info["phases_seconds"])
    # the auxiliary head is training-only: nothing of it in the saved adapter
    from safetensors import safe_open

    with safe_open(str(quick_model / "init" / "adapter_model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if "aux" in k]  # noqa: SIM118 -- safe_open is not iterable
    cfg = ModelConfig.from_file(quick_model / "models.yaml")
    assert cfg.has_reviser and not cfg.is_demo and cfg.revision_view == "full"
    assert not ModelConfig.from_file(quick_model / "models-stage1.yaml").has_reviser
    flow = XFlow.from_config(cfg)
    image, _ = load_cxr(_sample_image())
    result = flow.run(image, "Segment the edema.")
    assert result.mask.shape == image.shape and isinstance(result.message, str)


def test_recipe_is_reproducible_from_its_seed(quick_model, tmp_path):
    """The same seed rebuilds the same phantoms and the same random starting weights."""
    from monailabel_xflow.training.demo import build_demo_vlm

    base = build_demo_vlm(tmp_path / "vlm", seed=0)
    from safetensors.numpy import load_file

    a = load_file(str(base / "model.safetensors"))
    b = load_file(str(quick_model.parent / "work" / "vlm" / "base" / "model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_work_folder_phases_depend_on_the_tokenizer_too(monkeypatch):
    """Finished phases are reused only for the same recipe, policy size and tokenizer."""
    import dataclasses

    from monailabel_xflow.policy import configs as gemma3_configs
    from monailabel_xflow.training.demo import QUICK, recipe_fingerprint

    first = recipe_fingerprint(QUICK)
    assert recipe_fingerprint(QUICK) == first == json.loads(json.dumps(first))  # as stored
    assert recipe_fingerprint(dataclasses.replace(QUICK, seed=1)) != first
    corpus = gemma3_configs._corpus
    monkeypatch.setattr(gemma3_configs, "_corpus", lambda: corpus() + ["an edited prompt"] * 50)
    assert recipe_fingerprint(QUICK)["tokenizer"] != first["tokenizer"]


def test_bad_recipe_override_is_refused(capsys):
    from monailabel_xflow.training.demo import main

    assert main(["--quick", "--set", "no_such_field=1"]) == 2
    assert "no_such_field" in capsys.readouterr().err
    # settings a phase reads minutes into the run are refused before it starts
    for bad, named in (
        ("rev_click_refinement=always", "rev_click_refinement"),
        ("click_refinement=../x", "click_refinement"),
        ("rev_pays=1.5", "rev_pays"),
        ("rev_pays=-0.1", "rev_pays"),
        ("rev_pays=nan", "rev_pays"),
        ("presence_bias=nan", "presence_bias"),
        ("presence_bias=-30", "presence_bias"),
        ("sft_vision_lr_scale=0", "aux_weight"),  # the quick recipe's π_init SFT has the mask loss on
    ):
        assert main(["--quick", "--out", "/nonexistent/never-written", "--set", bad]) == 2, bad
        assert named in capsys.readouterr().err
    frozen = ["--set", "rev_vision_lr_scale=0", "--set", "rev_aux_weight=1"]
    assert main(["--quick", "--out", "/nonexistent/never-written", *frozen]) == 2
    assert "rev_aux_weight" in capsys.readouterr().err


def test_heldout_set_is_balanced_over_levels_and_signs(tmp_path):
    from monailabel_xflow.data.readers import read_mimic_ils
    from monailabel_xflow.training.demo import export_heldout

    path = export_heldout(tmp_path / "heldout", seed=1000, questions=24, progress=False)
    cases = read_mimic_ils(path, split="test").cases
    assert len(cases) == 24
    for level in ("chest", "lung", "zone"):
        mine = [c for c in cases if c.instruction.level == level]
        assert len(mine) == 8 and sum(c.positive for c in mine) == 4


# --- the app, through the MONAI Label client ------------------------------------------------------


@needs_demo
@pytest.mark.timeout(600)
def test_app_serves_the_demo_through_the_client(tmp_path):
    """Nothing configured: the app serves the demo, says so in /info, and answers with a mask."""
    import shutil

    import requests
    from servers import monailabel_server

    studies = tmp_path / "studies"
    studies.mkdir()
    shutil.copy(_sample_image(), studies)
    with monailabel_server(studies, tmp_path / "server") as server:
        info = requests.get(f"{server.url}/info/", timeout=60).json()
        assert info["xflow_models"]["configured"] and info["xflow_models"]["source"] == "demo"
        assert DEMO_NOTICE in json.dumps(info)
        label, params = server.client(tmp_path).infer(
            "xflow", _sample_image().stem, {"instruction": "Segment the effusion in the left lung."}
        )
        assert Path(label).is_file()
        assert isinstance(params["answer"], str) and params["answer"].endswith(".")
        assert DEMO_NOTICE in server.proc.tail(200_000)


def test_presence_is_balanced_within_each_level_and_finding():
    """Pooled balancing left chest questions ~58 % positive; strata make each kind 50/50."""
    from collections import Counter

    from datasets import Dataset

    from monailabel_xflow.training.demo import balanced_presence

    rows = Dataset.from_dict(
        {
            "positive": [True] * 2 + [False] * 8 + [True] * 3 + [False] * 3 + [False] * 4,
            "level": ["chest"] * 10 + ["lung"] * 6 + ["zone"] * 4,
            "finding": ["edema"] * 20,
            "i": list(range(20)),
        }
    )
    counts = Counter(zip(balanced_presence(rows, 0)["level"], balanced_presence(rows, 0)["positive"], strict=True))
    assert counts == {
        ("chest", True): 8,
        ("chest", False): 8,
        ("lung", True): 3,
        ("lung", False): 3,
        ("zone", False): 4,
    }
    pooled = Counter(
        zip(balanced_presence(rows, 0, by=())["level"], balanced_presence(rows, 0, by=())["positive"], strict=True)
    )
    assert pooled[("lung", True)] > pooled[("lung", False)]  # what stratifying corrects
    assert set(balanced_presence(rows, 0)["i"]) == set(range(20))  # every row kept


def test_recipe_reuses_trained_parts(quick_model, tmp_path):
    """segmenter_from / init_from / rev_from: F_seg and π_rev copied as they are, π_init warm-started."""
    from safetensors.numpy import load_file

    from monailabel_xflow.training.demo import main

    rc = main(
        [
            "--quick",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--set",
            "rl_steps_init=0",
            "--set",
            f"segmenter_from={quick_model / 'segmenter'}",
            "--set",
            f"init_from={quick_model / 'init'}",
            "--set",
            f"rev_from={quick_model / 'rev'}",
            "--set",
            "parallel=false",
            "--set",
            "threads=1",
        ]
    )
    assert rc == 0
    model = tmp_path / "model"
    for rel in ("segmenter/model.safetensors", "rev/adapter_model.safetensors"):
        a, b = load_file(str(model / rel)), load_file(str(quick_model / rel))
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), rel
    a, b = (
        load_file(str(model / "init/adapter_model.safetensors")),
        load_file(str(quick_model / "init/adapter_model.safetensors")),
    )
    assert a.keys() == b.keys() and any(not np.array_equal(a[k], b[k]) for k in a)  # trained further
    info = json.loads((model / "recipe.json").read_text())
    assert info["segmenter"]["reused_from"] == str(quick_model / "segmenter")
    assert "rev-sft" not in info["done"] and "build rev-sft" not in info["done"] and "init-sft" in info["done"]
    # a folder that holds no weights is refused before anything trains
    assert main(["--quick", "--out", str(tmp_path / "bad"), "--set", f"segmenter_from={tmp_path / 'nope'}"]) == 2
    assert not (tmp_path / "bad").exists()


def test_recipe_fine_tunes_only_f_seg_when_asked(quick_model, tmp_path):
    """An F_seg-only change: seg_init_from + revision-aware prompts train F_seg from the given one;
    init_from with init_sft_steps=0, rl_steps_init=0 and rev_from keep both policies byte for byte."""
    from safetensors.numpy import load_file

    from monailabel_xflow.training.demo import main

    rc = main(
        [
            "--quick",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--set",
            f"seg_init_from={quick_model / 'segmenter'}",
            "--set",
            "seg_revision_clicks=2",
            "--set",
            "seg_revision_prob=1.0",
            "--set",
            "seg_eval=1",
            "--set",
            f"init_from={quick_model / 'init'}",
            "--set",
            "init_sft_steps=0",
            "--set",
            "rl_steps_init=0",
            "--set",
            f"rev_from={quick_model / 'rev'}",
            "--set",
            "parallel=false",
            "--set",
            "threads=1",
        ]
    )
    assert rc == 0
    model = tmp_path / "model"
    for rel in ("init/adapter_model.safetensors", "rev/adapter_model.safetensors"):
        a, b = load_file(str(model / rel)), load_file(str(quick_model / rel))
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), rel
    a, b = (
        load_file(str(model / "segmenter/model.safetensors")),
        load_file(str(quick_model / "segmenter/model.safetensors")),
    )
    assert a.keys() == b.keys() and any(not np.array_equal(a[k], b[k]) for k in a)  # F_seg trained further
    info = json.loads((model / "recipe.json").read_text())
    assert "init-sft" not in info["done"] and info["recipe"]["seg_revision_clicks"] == 2


def test_recipe_packages_the_pre_trained_tower_and_can_freeze_it(quick_model, tmp_path):
    """vision_from reuses a pre-trained base (the packaged base/ is it, not the random one);
    sft_vision_lr_scale=0 leaves π_init's adapter without a tower copy while π_rev trains its own,
    and the packaged model still runs both stages."""
    from safetensors.numpy import load_file

    from monailabel_xflow.training.demo import main
    from monailabel_xflow.transforms import load_cxr
    from monailabel_xflow.workflow.xflow import XFlow

    work = quick_model.parent / "work" / "vlm"
    pre, random = load_file(str(work / "pretrained/model.safetensors")), load_file(str(work / "base/model.safetensors"))
    tower = [k for k in pre if "vision_tower" in k]
    assert tower and any(not np.array_equal(pre[k], random[k]) for k in tower)  # the phase trained it
    args = ["--quick", "--out", str(tmp_path), "--no-progress", "--set", f"vision_from={work / 'pretrained'}"]
    # vision_steps=0: a reused tower is used whatever the step count (it was once dropped silently)
    settings = ("vision_steps=0", "sft_vision_lr_scale=0", "aux_weight=0", "rl_steps_rev=0", "rev_components=2")
    for kv in (*settings, "parallel=false"):
        args += ["--set", kv]
    assert main(args + ["--set", f"segmenter_from={quick_model / 'segmenter'}"]) == 0
    model = tmp_path / "model"
    base = load_file(str(model / "base/model.safetensors"))
    assert all(np.array_equal(base[k], pre[k]) for k in tower)
    init, rev = (
        load_file(str(model / "init/adapter_model.safetensors")),
        load_file(str(model / "rev/adapter_model.safetensors")),
    )
    assert not [k for k in init if "vision_tower" in k] and [k for k in rev if "vision_tower" in k]
    info = json.loads((model / "recipe.json").read_text())
    assert info["done"]["vision-pretrain"]["result"]["reused_from"] == str(work / "pretrained")
    flow = XFlow.from_config(ModelConfig.from_file(model / "models.yaml"))
    image, _ = load_cxr(_sample_image())
    assert flow.run(image, "Segment the effusion in the left lung.").mask.shape == image.shape


def test_balanced_revisions_caps_stop_only_trajectories_and_keeps_every_clicking_one():
    from datasets import Dataset

    from monailabel_xflow.training.demo import balanced_revisions

    stop = "<think>The mask fits the lesion.</think><stop/>"
    click = "<think>Missed part.</think><click>+ 500 500</click>"
    rows = Dataset.from_dict(
        {
            "case_id": [f"c{k}" for k in range(10)],
            "targets": [[stop]] * 7 + [[click, stop], [click, click, stop], [click, stop]],
        }
    )
    kept = balanced_revisions(rows, 1.0, seed=0)
    turns = [len(t) for t in kept["targets"]]
    assert sorted(turns) == [1, 1, 1, 2, 2, 3]  # all 3 clicking, 3 of the 7 stop-only
    assert kept["case_id"] == sorted(kept["case_id"], key=lambda c: int(c[1:]))  # original order kept
    assert len(balanced_revisions(rows, 2.0)) == 3 + 6
    assert len(balanced_revisions(rows, 0.0)) == 10  # 0: keep all
    assert len(balanced_revisions(rows, 10.0)) == 10  # cannot keep more than there are


def test_balanced_questions_draws_every_level_and_sign_alike():
    from collections import Counter

    from monailabel_xflow.data.readers import EvalCase
    from monailabel_xflow.instructions import Instruction
    from monailabel_xflow.training.demo import balanced_questions

    def case(k: int, level: str, positive: bool) -> EvalCase:
        regions = {"chest": (), "lung": ("left lung",), "zone": ("left lung base",)}[level]
        kind = "global" if level == "chest" else "basic"
        return EvalCase(f"c{k}", Path(f"{k}.png"), Instruction("edema", regions, kind), positive)

    # phantom-like: ~13 % positive, so a uniform draw would be mostly "absent"
    cases = [case(k, level, k % 8 == 0) for k, level in enumerate(["chest", "lung", "zone"] * 80)]
    drawn = balanced_questions(cases, 36, np.random.default_rng(0))
    counts = Counter((c.level, c.positive) for c in drawn)
    assert set(counts.values()) == {6} and len(counts) == 6
    assert len({c.case_id for c in drawn}) == len(drawn)  # without replacement
    again = balanced_questions(cases, 36, np.random.default_rng(0))
    assert [c.case_id for c in again] == [c.case_id for c in drawn]
    # a stratum smaller than its share gives all it has
    few = balanced_questions(cases, 600, np.random.default_rng(1))
    assert Counter((c.level, c.positive) for c in few)[("lung", True)] == sum(
        c.level == "lung" and c.positive for c in cases
    )


def test_recipe_runs_a_second_init_sft_round_from_the_first(quick_model, tmp_path):
    """init_sft2_steps: phase init-sft-2 warm-starts from π_init's SFT adapter at its own rate and is
    what π_init becomes (GRPO off); rl_temperature reaches the GRPO config."""
    from safetensors.numpy import load_file

    from monailabel_xflow.training.demo import main

    args = ["--quick", "--out", str(tmp_path), "--no-progress"]
    for kv in (
        f"init_from={quick_model / 'init'}",
        "init_sft_steps=0",
        "init_sft2_steps=2",
        "init_sft2_lr=0.0005",
        "rl_steps_init=0",
        f"rev_from={quick_model / 'rev'}",
        f"segmenter_from={quick_model / 'segmenter'}",
        "rl_temperature=0.5",
        "parallel=false",
        "threads=1",
    ):
        args += ["--set", kv]
    assert main(args) == 0
    info = json.loads((tmp_path / "model" / "recipe.json").read_text())
    assert info["done"]["init-sft-2"]["result"]["steps"] == 2 and "init-sft" not in info["done"]
    assert info["recipe"]["rl_temperature"] == 0.5
    summary = json.loads((tmp_path / "work" / "runs" / "init-sft-2" / "xflow_training.json").read_text())
    assert summary["config"]["learning_rate"] == 0.0005 and summary["init_from"] == str(quick_model / "init")
    a = load_file(str(tmp_path / "model" / "init" / "adapter_model.safetensors"))
    b = load_file(str(quick_model / "init" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and any(not np.array_equal(a[k], b[k]) for k in a)


def _pi_rev_only(quick_model: Path, out: Path, *settings: str) -> int:
    """``xflow train demo --quick --out OUT`` reusing the quick model's π_init and F_seg, so only
    π_rev is built and trained (no GRPO), with ``settings`` added; returns the exit code."""
    from monailabel_xflow.training.demo import main

    reuse = (f"init_from={quick_model / 'init'}", f"segmenter_from={quick_model / 'segmenter'}", "parallel=false")
    args = ["--quick", "--out", str(out), "--no-progress"]
    for kv in (*reuse, "init_sft_steps=0", "rl_steps_init=0", "rl_steps_rev=0", *settings):
        args += ["--set", kv]
    return main(args)


def test_rev_onpolicy_builds_pi_rev_states_from_the_demo_stage1(quick_model, tmp_path, monkeypatch):
    """rev_onpolicy: π_rev's rev-sft rows come from the workflow of the π_init just trained (here
    the quick model's, reused) with the run's F_seg, not from perturbed true boxes. rev_zoom:
    they show the zoomed view, and the packaged model tells π_rev to look at it.
    rev_click_refinement: Stage 2 refines the oracle's clicks there, and in the packaged model.
    rev_pays: the threshold reaches the builder. presence_bias: the Stage 1 of those states, and
    both packaged models files."""
    from monailabel_xflow.training import builders
    from monailabel_xflow.training.demo_phases import DemoRun

    adapters, kinds, refinements, biases = [], [], [], []
    real_workflow, real_build = DemoRun.workflow, builders.build

    def workflow(self, init_adapter):
        adapters.append(Path(init_adapter))
        flow = real_workflow(self, init_adapter)
        refinements.append(flow.segmenter.refinement)
        biases.append(flow.stage1.presence_bias)
        return flow

    def build(kind, cases, out_dir, **kw):
        kinds.append((kind, type(kw.get("workflow")).__name__, kw.get("segmenter"), kw.get("zoom"), kw.get("pays")))
        return real_build(kind, cases, out_dir, **kw)

    monkeypatch.setattr(DemoRun, "workflow", workflow)
    monkeypatch.setattr(builders, "build", build)
    settings = ("rev_components=3", "rev_onpolicy=true", "rev_zoom=true", "rev_click_refinement=brs")
    assert _pi_rev_only(quick_model, tmp_path, *settings, "rev_pays=0.05", "presence_bias=-0.25") == 0
    assert adapters == [quick_model / "init"]
    assert refinements == [ClickRefinement()]
    assert biases == [-0.25]  # π_rev's states come from the π_init it will follow, as configured
    assert ("rev-sft", "XFlow", None, True, 0.05) in kinds
    assert (tmp_path / "model" / "rev" / "adapter_config.json").is_file()
    cfg = ModelConfig.from_file(tmp_path / "model" / "models.yaml")
    assert cfg.revision_view == "zoom" and cfg.stage2_click_refinement == "brs"
    stage1_only = ModelConfig.from_file(tmp_path / "model" / "models-stage1.yaml")
    assert stage1_only.stage2_click_refinement == "none"
    assert cfg.stage1_presence_bias == stage1_only.stage1_presence_bias == -0.25  # the same π_init, both files
    from monailabel_xflow.workflow.model_config import load_models

    reviser = load_models(cfg).reviser
    assert (
        reviser is not None
        and reviser.start(np.zeros((8, 8), np.float32), parse_instruction("Segment the edema."), (0, 0, 1, 1)).zoom
    )


def test_rev_aux_weight_trains_pi_rev_with_the_error_loss(quick_model, tmp_path):
    """rev_aux_weight: π_rev SFT's auxiliary error loss is on, with the weight asked for, and its
    rows carry one error map per observation."""
    from monailabel_xflow.training.builders import load_built

    assert _pi_rev_only(quick_model, tmp_path, "rev_components=2", "rev_aux_weight=2.0") == 0
    rows = load_built(tmp_path / "work" / "built" / "rev-sft")
    assert all(len(r["error_masks"]) == len(r["observations"]) for r in rows)
    run = json.loads((tmp_path / "work" / "runs" / "rev-sft" / "xflow_training.json").read_text())
    assert run["config"]["aux_mask_loss_weight"] == 2.0
    assert run["aux_mask_loss"] and np.isfinite(run["aux_mask_loss"]).all()
