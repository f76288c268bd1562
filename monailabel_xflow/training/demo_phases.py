"""The demo recipe's phases: each a step of :func:`~monailabel_xflow.training.demo.train_demo`,
run once per work folder (:class:`Phases` records it in ``work/phases.json``) and skipped when
the recipe is rerun unchanged.

Data (:func:`data_phase`) -> F_seg (:func:`segmenter_phase`, in a second, spawned process while
π_init trains when the recipe is parallel: :func:`start_segmenter_phase` /
:func:`finish_segmenter_phase`) -> base VLM (:func:`base_vlm_phase`) -> vision pre-training
(:func:`vision_pretrain_phase`) -> π_init SFT (:func:`init_sft_phase`) -> π_rev trajectories and SFT
(:func:`rev_sft_phase`) -> GRPO (:func:`rl_phase`) -> packaging (:func:`package_phase`).
:class:`DemoRun` holds one invocation's settings, folders and phase log. Heavy imports (torch,
transformers, datasets) happen inside the functions.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from monailabel_xflow.data.readers import EvalCase
from monailabel_xflow.training.demo_data import (
    balanced_presence,
    balanced_questions,
    balanced_revisions,
    export_phantoms,
    training_cases,
)
from monailabel_xflow.training.demo_package import SEGMENTER_FILES, copy_files, package
from monailabel_xflow.training.demo_recipe import DEMO_VLM_SPEC, DemoRecipe, build_demo_vlm

if TYPE_CHECKING:
    from monailabel_xflow.policy.oracle import OracleClicker

__all__ = [
    "Phases",
    "DemoRun",
    "PendingSegmenter",
    "set_threads",
    "segmenter_phase",
    "reuse_segmenter",
    "reuse_vision",
    "data_phase",
    "start_segmenter_phase",
    "finish_segmenter_phase",
    "base_vlm_phase",
    "vision_pretrain_phase",
    "init_sft_phase",
    "rev_sft_phase",
    "rl_phase",
    "package_phase",
]

log = logging.getLogger(__name__)


class Phases:
    """Runs named phases once each, logs their duration, and skips those already done.

    ``work/phases.json`` records each finished phase (its seconds and JSON-able result) under the
    recipe's fingerprint (:func:`~monailabel_xflow.training.demo_recipe.recipe_fingerprint`); a
    work folder of other settings starts afresh.

    Args:
        work: the recipe's work folder.
        fingerprint: what the finished phases depend on.

    Attributes:
        state: ``{"fingerprint", "done": {phase: {"seconds", "result"}}}`` as stored.
        times: seconds of each phase run or reused in this invocation.
    """

    def __init__(self, work: Path, fingerprint: dict[str, Any]) -> None:
        self.work = work
        self.state_file = work / "phases.json"
        state: dict[str, Any] = json.loads(self.state_file.read_text()) if self.state_file.is_file() else {}
        if state.get("fingerprint") != fingerprint:  # other settings: nothing can be reused
            state = {"fingerprint": fingerprint, "done": {}}
        self.state = state
        self.times: dict[str, float] = {}

    def run(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` as phase ``name``, or the recorded result when it is done."""
        if name in self.state["done"]:
            log.info("demo: %s already done, reusing %s", name, self.work)
            self.times[name] = self.state["done"][name]["seconds"]
            return self.state["done"][name].get("result")
        log.info("demo: %s ...", name)
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        seconds = time.perf_counter() - start
        self.times[name] = seconds
        log.info("demo: %s done in %.1f s", name, seconds)
        self.state["done"][name] = {"seconds": seconds, "result": result}
        self.state_file.write_text(json.dumps(self.state, indent=1, default=str))
        return result


def set_threads(n: int = 2) -> None:
    """Torch intra-op threads: ``n``, at most the machine's cores, at least 1."""
    import os

    import torch

    torch.set_num_threads(max(1, min(n, os.cpu_count() or 1)))


def _exit_with_parent(parent_pid: int) -> None:
    """In a worker process: exit as soon as ``parent_pid`` is gone (killed recipe, no orphan)."""
    import os
    import threading

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def segmenter_phase(
    work: str,
    json_path: str,
    recipe: DemoRecipe,
    progress: bool = True,
    threads: int | None = None,
    parent_pid: int | None = None,
) -> dict[str, Any]:
    """F_seg: a random reduced-size SAM3 tracker, trained on the training phantoms' lesions.

    The project trainer, end to end (``recipe.seg_steps`` steps); the result is
    ``work/segmenter``. Runs in a separate process when the recipe is parallel (hence plain
    arguments and a dict result).
    """
    from monailabel_xflow.segmenter.configs import build_random_sam3
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.training.config import load_config
    from monailabel_xflow.training.segmenter import box_prompted_iou, finetune_segmenter, samples_from_cases

    if threads:
        set_threads(threads)
    if parent_pid is not None:
        _exit_with_parent(parent_pid)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    start_time = time.perf_counter()
    work_dir = Path(work)
    seg_dir = work_dir / "segmenter"
    seed = recipe.seed
    cases = [c for c in training_cases(Path(json_path)) if c.positive]
    samples = samples_from_cases(cases, progress=progress)
    # one sample per lesion component: lung-, zone- and chest-level questions repeat masks
    unique: dict[tuple[bytes, bytes], Any] = {}
    for s in samples:
        unique.setdefault((s.image[::8, ::8].tobytes(), s.mask.tobytes()), s)
    samples = list(unique.values())
    if recipe.seg_init_from:
        start = Path(recipe.seg_init_from)
    else:
        start = build_random_sam3(work_dir / "sam3-random", recipe.seg_size, seed, recipe.seg_image_size)
    cfg = load_config(
        "segmenter",
        max_steps=recipe.seg_steps,
        effective_batch=recipe.seg_batch,
        learning_rate=recipe.seg_lr,
        focal_weight=recipe.seg_focal_weight,
        encoder_lr_scale=1.0,
        layer_decay=1.0,
        grad_clip=1.0,
        seed=seed,
        revision_clicks=recipe.seg_revision_clicks,
        revision_prob=recipe.seg_revision_prob,
        interactive_rounds=recipe.seg_interactive_rounds,
        interactive_click_start=recipe.seg_interactive_click_start,
        interactive_mask_dropout=recipe.seg_interactive_mask_dropout,
        interactive_oracle_prob=recipe.seg_interactive_oracle_prob,
        zoom_prob=recipe.seg_zoom_prob,
        checkpoint_every=recipe.seg_checkpoint_every,
    )
    result = finetune_segmenter(start, samples, seg_dir, cfg, progress=progress)
    held = samples[:: max(1, len(samples) // recipe.seg_eval)][: recipe.seg_eval]
    iou = box_prompted_iou(load_segmenter(str(seg_dir)), held)
    log.info("demo: F_seg box-prompted IoU on %d training components: %.3f", len(held), iou)
    return {
        "samples": len(samples),
        "steps": result["steps"],
        "loss_first_last": [float(np.mean(result["losses"][:20])), float(np.mean(result["losses"][-20:]))],
        "box_prompted_iou_train": iou,
        "seconds": time.perf_counter() - start_time,
    }


def reuse_segmenter(source: str | Path, seg_dir: Path) -> dict[str, Any]:
    """Copy a trained F_seg into ``seg_dir`` (recipe field ``segmenter_from``).

    Returns:
        The phase record: the source, and the source's own segmenter record when it sits in a
        packaged demo (``../recipe.json``), so the model card keeps its training figures.

    Raises:
        FileNotFoundError: ``source`` holds no ``config.json`` / ``model.safetensors``.
    """
    source = Path(source)
    for name in SEGMENTER_FILES:
        if not (source / name).is_file():
            raise FileNotFoundError(f"segmenter_from: {source / name} does not exist")
    copy_files(source, seg_dir, SEGMENTER_FILES)
    info: dict[str, Any] = {}
    recipe_json = source.parent / "recipe.json"
    if recipe_json.is_file():
        info = dict(json.loads(recipe_json.read_text()).get("segmenter", {}))
    info.update(reused_from=str(source), seconds=0.0)
    return info


def reuse_vision(source: str | Path, dest: Path) -> dict[str, Any]:
    """Copy a vision-pre-trained base into ``dest`` (recipe field ``vision_from``).

    Returns:
        The phase record: the source's own ``xflow_vision.json`` (its figures and duration) and
        where it came from.

    Raises:
        FileNotFoundError: ``source`` holds no ``config.json``.
    """
    source = Path(source)
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"vision_from: {source / 'config.json'} does not exist")
    copy_files(source, dest)
    record = source / "xflow_vision.json"
    info: dict[str, Any] = json.loads(record.read_text()) if record.is_file() else {}
    info.update(reused_from=str(source))
    return info


@dataclass
class DemoRun:
    """One invocation of the recipe: its settings, folders and phase log, shared by the phases.

    ``rng`` (seeded with ``recipe.seed``) is drawn from in a fixed order (the π_rev questions,
    then the ``init-rl`` questions) so a rerun picks the same questions.
    """

    recipe: DemoRecipe
    out: Path
    progress: bool
    phases: Phases
    rng: np.random.Generator

    @property
    def work(self) -> Path:
        return self.out / "work"

    @property
    def built(self) -> Path:
        return self.work / "built"

    @property
    def runs(self) -> Path:
        return self.work / "runs"

    @property
    def seg_dir(self) -> Path:
        return self.work / "segmenter"

    @property
    def base(self) -> Path:
        """The base VLM every policy phase starts from: the random one, or its vision-pre-trained
        copy when the recipe pre-trains the tower."""
        pretrained = self.recipe.vision_steps > 0 or bool(self.recipe.vision_from)
        return self.work / "vlm" / ("pretrained" if pretrained else "base")

    def workflow(self, init_adapter: Path) -> Any:
        """The Stage 1 workflow π_rev will follow: the base with ``init_adapter`` at the recipe's
        presence operating point (``recipe.presence_bias``) and the run's F_seg, no π_rev
        (on-policy revision data, ``recipe.rev_onpolicy``); Stage 2's clicks refined as
        ``recipe.rev_click_refinement`` says."""
        from monailabel_xflow.workflow.xflow import XFlow

        config = {
            "vlm_base": str(self.base),
            "init_adapter": str(init_adapter),
            "segmenter": str(self.seg_dir),
            "stage2_click_refinement": self.recipe.rev_click_refinement,
            "stage1_presence_bias": self.recipe.presence_bias,
        }
        return XFlow.from_config({**config, "max_clicks": self.recipe.max_clicks, "device": "cpu"})

    def rev_segmenter(self) -> Any:
        """The run's F_seg as π_rev's clicks meet it (``recipe.rev_click_refinement``)."""
        from monailabel_xflow.segmenter.loading import load_segmenter
        from monailabel_xflow.segmenter.refine import refinement_for

        return load_segmenter(str(self.seg_dir), refinement=refinement_for(self.recipe.rev_click_refinement))

    def build(self, kind: str, subset: Sequence[EvalCase], **kw: Any) -> dict[str, Any]:
        """Builder rows of ``kind`` into ``work/built/<kind>``; returns the row and reject counts."""
        from monailabel_xflow.training import builders

        report = builders.build(kind, subset, self.built / kind, seed=self.recipe.seed, progress=self.progress, **kw)
        return {"rows": report.rows, "rejected": report.rejected}

    def sft(
        self, stage: str, steps: int, data: Any, dest: Path, init_from: Path | None, aux: float, lr: float | None = None
    ) -> dict[str, Any]:
        """SFT of the base VLM's ``stage`` adapter into ``dest`` (peak rate ``lr``, default
        ``recipe.sft_lr``); returns steps and first/last loss."""
        from monailabel_xflow.training.config import load_config
        from monailabel_xflow.training.sft import train_sft

        r = self.recipe
        cfg = load_config(
            stage,
            max_steps=steps,
            effective_batch=r.sft_batch,
            learning_rate=r.sft_lr if lr is None else lr,
            lora_r=DEMO_VLM_SPEC["lora_r"],
            lora_alpha=DEMO_VLM_SPEC["lora_r"],
            vision_lr_scale=r.sft_vision_lr_scale if stage == "init-sft" else r.rev_vision_lr_scale,
            aux_mask_loss_weight=aux,
            seed=r.seed,
        )
        s = train_sft(
            stage, data, self.base, dest, cfg, init_from=init_from, per_device_batch=r.sft_batch, progress=self.progress
        )
        return {
            "steps": s["steps"],
            "first_loss": s["losses"][0] if s["losses"] else None,
            "last_loss": s["losses"][-1] if s["losses"] else None,
        }

    def rl(
        self,
        stage: str,
        steps: int,
        data_cases: Sequence[EvalCase],
        start: Path,
        dest: Path,
        clicker: OracleClicker,
        workflow: Any = None,
    ) -> dict[str, Any]:
        """Build ``stage``'s rows (from ``workflow``'s Stage 1 when given: on-policy ``rev-rl``),
        then GRPO from adapter ``start`` into ``dest`` (F_seg in the loop for ``rev-rl``); returns
        steps and reward."""
        from monailabel_xflow.training.config import load_config
        from monailabel_xflow.training.grpo import train_grpo

        r = self.recipe
        self.build(stage, data_cases, clicker=clicker, workflow=workflow, pays=r.rev_pays)
        cfg = load_config(
            stage,
            max_steps=steps,
            effective_batch=r.rl_batch,
            num_generations=r.rl_generations,
            learning_rate=r.rl_lr,
            temperature=r.rl_temperature,
            max_clicks=r.max_clicks,
            seed=r.seed,
        )
        s = train_grpo(
            stage,
            self.built / stage,
            self.base,
            dest,
            start,
            cfg,
            segmenter=self.rev_segmenter() if stage == "rev-rl" else None,
            max_new_tokens=200 if stage == "init-rl" else 48,
            per_device_batch=r.rl_batch,
            progress=self.progress,
            zoom=r.rev_zoom and stage == "rev-rl",
        )
        return {"steps": s["steps"], "reward": s["reward"]}


@dataclass
class PendingSegmenter:
    """F_seg training running in a worker process (``pool`` runs ``future``)."""

    pool: ProcessPoolExecutor
    future: Future[dict[str, Any]]


def data_phase(run: DemoRun) -> tuple[str, list[EvalCase]]:
    """Phase ``phantoms``: export the training phantoms (once per work folder).

    Returns:
        ``(json_path, cases)``: the ``mimic_ils.json`` path and its questions, every split.
    """
    r = run.recipe
    json_path = run.phases.run(
        "phantoms",
        lambda: str(
            export_phantoms(
                run.work / "phantoms", r.train_studies, r.seed, r.phantom_size, run.progress, "training phantoms"
            )
        ),
    )
    cases = training_cases(Path(json_path))
    log.info("demo: %d training questions from %d phantoms", len(cases), r.train_studies)
    return json_path, cases


def start_segmenter_phase(run: DemoRun, json_path: str) -> PendingSegmenter | None:
    """Phase ``segmenter``: copy ``recipe.segmenter_from``, or train F_seg into ``work/segmenter``.

    With ``recipe.parallel`` the training runs in a second process while the policy trains
    (two independent jobs on two cores) and this returns it pending, for
    :func:`finish_segmenter_phase`; otherwise the phase is done on return (None).
    """
    r = run.recipe
    if "segmenter" not in run.phases.state["done"] and r.segmenter_from:
        run.phases.run("segmenter", reuse_segmenter, r.segmenter_from, run.seg_dir)
    if "segmenter" in run.phases.state["done"]:
        return None
    if not r.parallel:
        run.phases.run("segmenter", segmenter_phase, str(run.work), json_path, r, run.progress)
        return None
    import multiprocessing
    import os

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    future = pool.submit(segmenter_phase, str(run.work), json_path, r, run.progress, 1, os.getpid())
    set_threads(1)
    return PendingSegmenter(pool, future)


def finish_segmenter_phase(run: DemoRun, pending: PendingSegmenter | None) -> dict[str, Any]:
    """Wait for a pending F_seg process (recorded as phase ``segmenter``); return the phase's record."""
    if pending is not None:
        run.phases.run("segmenter", pending.future.result)
        pending.pool.shutdown()
        set_threads(run.recipe.threads)
    record: dict[str, Any] = run.phases.state["done"]["segmenter"]["result"]
    return record


def base_vlm_phase(run: DemoRun) -> Path:
    """Phase ``base-vlm``: the random demo-size Gemma 3 in ``work/vlm/base``; returns that folder."""
    run.phases.run("base-vlm", lambda: str(build_demo_vlm(run.work / "vlm", run.recipe.seed)))
    return run.work / "vlm" / "base"


def vision_pretrain_phase(run: DemoRun) -> None:
    """Phase ``vision-pretrain``: the random base's tower and projector pre-trained on every
    ``init-sft`` row (:mod:`~monailabel_xflow.training.vision_pretrain`) into ``work/vlm/pretrained``,
    which the policy phases then start from (``run.base``); with ``vision_from`` that base is
    copied instead, whatever ``vision_steps``. Skipped at ``vision_steps == 0`` otherwise."""
    from monailabel_xflow.training import builders
    from monailabel_xflow.training.vision_pretrain import pretrain_vision

    r = run.recipe
    if r.vision_from:  # before the step count: a reused tower must not be dropped silently
        run.phases.run("vision-pretrain", reuse_vision, r.vision_from, run.base)
        return
    if r.vision_steps <= 0:
        return
    run.phases.run(
        "vision-pretrain",
        pretrain_vision,
        run.work / "vlm" / "base",
        builders.load_built(run.built / "init-sft"),
        run.base,
        r.vision_steps,
        batch=r.vision_batch,
        lr=r.vision_lr,
        seed=r.seed,
        progress=run.progress,
    )


def init_sft_phase(run: DemoRun, json_path: str, cases: Sequence[EvalCase]) -> Path:
    """Phases ``build init-sft`` and ``init-sft``: π_init's rows (lung boxes from the phantoms'
    lung masks), presence-balanced, then SFT with the auxiliary mask loss.

    ``recipe.init_from`` warm-starts the SFT, or, with ``init_sft_steps == 0``, is π_init as it is.

    Returns:
        π_init's adapter folder.
    """
    from monailabel_xflow.training import builders

    r = run.recipe
    lungs = builders.LungBoxes.for_dataset(Path(json_path).parent.parent)
    run.phases.run("build init-sft", run.build, "init-sft", cases, lung_boxes=lungs)
    vision_pretrain_phase(run)
    init_sft = run.runs / "init-sft"
    balanced = balanced_presence(builders.load_built(run.built / "init-sft"), r.seed)
    warm = Path(r.init_from) if r.init_from else None
    if warm is not None and r.init_sft_steps == 0:  # π_init reused as it is (e.g. an F_seg-only change)
        log.info("demo: π_init reused from %s", warm)
        init_sft = warm
    else:
        run.phases.run("init-sft", run.sft, "init-sft", r.init_sft_steps, balanced, init_sft, warm, r.aux_weight)
    if r.init_sft2_steps > 0:
        second = run.runs / "init-sft-2"
        run.phases.run(
            "init-sft-2",
            run.sft,
            "init-sft",
            r.init_sft2_steps,
            balanced,
            second,
            init_sft,
            r.aux_weight,
            r.init_sft2_lr,
        )
        init_sft = second
    return init_sft


def rev_sft_phase(
    run: DemoRun, cases: Sequence[EvalCase], init_sft: Path
) -> tuple[Path, list[EvalCase], OracleClicker]:
    """Phases ``build rev-sft`` and ``rev-sft``: oracle trajectories with the trained F_seg in the
    loop on ``recipe.rev_components`` lung-level questions, stop-balanced, then π_rev SFT
    warm-started from π_init.

    ``recipe.rev_from`` is π_rev as it is (no build, no SFT). When every trajectory is discarded
    (an F_seg that does not improve with clicks) π_rev starts from π_init's adapter.

    Returns:
        ``(rev_sft, rev_cases, clicker)``: π_rev's adapter folder, the questions drawn and the
        oracle clicker (``rev-rl`` reuses both).
    """
    from monailabel_xflow.policy.oracle import OracleClicker
    from monailabel_xflow.training import builders

    r = run.recipe
    positives = [c for c in cases if c.positive and c.level == "lung"]  # one question per lesion set
    rev_cases = [positives[k] for k in sorted(run.rng.permutation(len(positives))[: r.rev_components])]
    clicker = OracleClicker(box_noise=r.rev_box_noise)

    def build_rev() -> dict[str, Any]:
        if r.rev_onpolicy:
            workflow = run.workflow(init_sft)
            return run.build("rev-sft", rev_cases, workflow=workflow, clicker=clicker, zoom=r.rev_zoom, pays=r.rev_pays)
        return run.build("rev-sft", rev_cases, segmenter=run.rev_segmenter(), clicker=clicker, zoom=r.rev_zoom)

    if r.rev_from:  # a trained π_rev is reused as it is (its own SFT and GRPO are not redone)
        log.info("demo: π_rev reused from %s", r.rev_from)
        return Path(r.rev_from), rev_cases, clicker
    run.phases.run("build rev-sft", build_rev)
    try:
        rows = builders.load_built(run.built / "rev-sft")
    except builders.BuildError:  # every trajectory discarded: an F_seg that clicks cannot improve
        log.warning(
            "demo: no π_rev trajectory was kept (F_seg does not improve with clicks); "
            "π_rev starts from π_init's SFT adapter without revision SFT"
        )
        return init_sft, rev_cases, clicker
    rev_sft = run.runs / "rev-sft"
    rev_rows = balanced_revisions(rows, r.rev_stop_ratio, r.seed)
    run.phases.run("rev-sft", run.sft, "rev-sft", r.rev_sft_steps, rev_rows, rev_sft, init_sft, r.rev_aux_weight)
    return rev_sft, rev_cases, clicker


def rl_phase(
    run: DemoRun,
    cases: Sequence[EvalCase],
    rev_cases: Sequence[EvalCase],
    init_sft: Path,
    rev_sft: Path,
    clicker: OracleClicker,
) -> tuple[Path, Path]:
    """Phases ``init-rl`` and ``rev-rl``: short GRPO of each policy from its SFT adapter (skipped
    at 0 steps; ``rev-rl`` also when π_rev was reused).

    Returns:
        ``(init_final, rev_final)``: the adapters to package.
    """
    r = run.recipe
    init_final, rev_final = init_sft, rev_sft
    if r.rl_steps_init > 0:
        rl_cases = balanced_questions(cases, 4 * r.rl_batch * r.rl_steps_init, run.rng)
        run.phases.run("init-rl", run.rl, "init-rl", r.rl_steps_init, rl_cases, init_sft, run.runs / "init-rl", clicker)
        init_final = run.runs / "init-rl"
    if r.rl_steps_rev > 0 and not r.rev_from:
        workflow = run.workflow(init_final) if r.rev_onpolicy else None
        rl_args = ("rev-rl", r.rl_steps_rev, rev_cases, rev_sft, run.runs / "rev-rl", clicker, workflow)
        run.phases.run("rev-rl", run.rl, *rl_args)
        rev_final = run.runs / "rev-rl"
    return init_final, rev_final


def package_phase(
    run: DemoRun, init_final: Path, rev_final: Path, seg_info: dict[str, Any], total_start: float
) -> Path:
    """Package the base, both adapters and F_seg into ``out/model`` with the phases' durations
    (an F_seg trained in parallel is listed apart: waiting for it is not its duration)."""
    model = run.out / "model"
    seconds = dict(run.phases.times)
    if run.recipe.parallel:
        seconds.pop("segmenter", None)
        seconds["total"] = sum(seconds.values())
        seconds["segmenter (ran in parallel with init-sft)"] = float(seg_info.get("seconds", 0.0))
    else:
        seconds["total"] = sum(seconds.values())
    log.info("demo: this invocation took %.1f min", (time.perf_counter() - total_start) / 60)
    package(
        model,
        run.base,
        init_final,
        rev_final,
        run.seg_dir,
        run.recipe,
        {"phases_seconds": seconds, "segmenter": seg_info, "done": run.phases.state["done"]},
    )
    log.info("demo: model written to %s (%.1f min in all)", model, seconds["total"] / 60)
    return model
