"""Model configuration: which weights XFlow runs, and where they come from.

XFlow needs three things: the policies' VLM (a base model with the π_init and π_rev LoRA
adapters, or two merged models) and the segmenter F_seg. :class:`ModelConfig` names them; each
name is a **local folder** (or, for the segmenter, a checkpoint file) or a **Hugging Face hub
id** (``org/name``, optionally ``org/name@revision``).

Nothing is ever downloaded at run time. A hub id is looked up in the local Hugging Face cache
only (``local_files_only=True``); if it is not there, loading fails with a
:class:`ModelConfigError` that says to run ``xflow weights pull``, which is the only code that
downloads (``huggingface_hub.snapshot_download`` with the user's token).

Sources of a configuration (see :meth:`ModelConfig.load`):

* a YAML or JSON file (``--models models.yaml``) holding the fields below; relative paths are
  resolved against the file's folder;
* a dict with the same keys;
* environment variables: ``XFLOW_MODELS`` (path of such a file) and, overriding it field by
  field, ``XFLOW_VLM_BASE``, ``XFLOW_INIT_ADAPTER``, ``XFLOW_REV_ADAPTER``, ``XFLOW_INIT_MODEL``,
  ``XFLOW_REV_MODEL``, ``XFLOW_SEGMENTER``, ``XFLOW_SEGMENTER_BACKEND``, ``XFLOW_DEVICE``,
  ``XFLOW_DTYPE``, ``XFLOW_CLICK_REFINEMENT``, ``XFLOW_STAGE2_CLICK_REFINEMENT``,
  ``XFLOW_STAGE2_STOP_BIAS``, ``XFLOW_STAGE1_PRESENCE_BIAS``, ``XFLOW_MAX_CLICKS``,
  ``XFLOW_MAX_NEW_TOKENS``, ``XFLOW_ROSALIA``.

Example ``models.yaml``::

    vlm_base: google/medgemma-1.5-4b-it     # hub id, cached by `xflow weights pull`
    init_adapter: ./adapters/init           # local folders, relative to this file
    rev_adapter: ./adapters/rev
    segmenter: ./sam3-cxr                   # Sam3TrackerModel folder, or an official sam3.pt
    device: cpu                             # "cuda", "cuda:1", "cpu"; default: cuda if available
    dtype: bfloat16                         # policy dtype: float32, bfloat16, float16; default per device
    encode_precision: float32               # F_seg's image encoder: float32 (default) or bfloat16
    click_refinement: brs                   # a person's clicks obeyed (segmenter/refine.py); default none
    stage2_click_refinement: brs            # π_rev's clicks too (only with a π_rev trained on them)
    stage1_presence_bias: -0.25             # answer "present" more readily (an operating point; default 0)
    rosalia: ./rosalia                      # optional: the ROSALIA baseline (the app's `rosalia` task)

A value that names an existing path (absolute, relative to the config file, or relative to the
working folder) is local; any other value of the form ``org/name`` is a hub id. Start a value
with ``./`` to insist that it is local (a missing folder is then an error, not a hub lookup).

The demo default
----------------
When nothing is configured (no ``--models``, no ``XFLOW_*`` weight variable), XFlow falls back to
the **demo model** committed in ``monailabel_xflow/demo/`` (:func:`demo_config`): a small XFlow
trained on synthetic phantoms by ``xflow train demo``, so the app and ``xflow segment`` work out of
the box. It is for trying the software only: every place that uses it says so with
:data:`DEMO_NOTICE` (the log, traces via :meth:`ModelConfig.identities`, the app's ``/info``).
Set ``XFLOW_NO_DEMO=1`` to turn the fallback off (nothing configured is then an error).

ROSALIA beside XFlow
--------------------
``rosalia`` names the weights of the paper's baseline (a ROSALIA folder,
:mod:`monailabel_xflow.rosalia`; a released LISA/ROSALIA checkpoint is converted to one by
``python -m monailabel_xflow.rosalia.checkpoint``), served by the app's ``rosalia`` task. It is not
one of XFlow's weights: a configuration naming only ``rosalia`` does not configure XFlow. Without
it, :func:`monailabel_xflow.rosalia.weights.rosalia_source` falls back to the **ROSALIA demo**
committed in ``monailabel_xflow/rosalia/demo/`` (``XFLOW_NO_DEMO=1`` turns that off too).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from monailabel_xflow.errors import UnavailableError, XFlowError
from monailabel_xflow.policy.base import (
    MAX_CLICKS,
    BudgetError,
    PolicyError,
    RevisionPolicy,
    Stage1Policy,
    check_budget,
    check_stop_bias,
)
from monailabel_xflow.segmenter.base import PromptableSegmenter
from monailabel_xflow.segmenter.loading import BACKENDS
from monailabel_xflow.segmenter.refine import CLICK_REFINEMENTS, refinement_for
from monailabel_xflow.weights import DTYPES, ENCODE_PRECISIONS, is_hub_id, split_hub_id

logger = logging.getLogger(__name__)

ENV_PREFIX = "XFLOW_"
ENV_FILE = "XFLOW_MODELS"
REVISION_VIEWS = ("full", "zoom")
_REFINEMENT_FIELDS = ("click_refinement", "stage2_click_refinement")
"""Fields naming a click refinement (``segmenter.refine.CLICK_REFINEMENTS``): the click tool's, Stage 2's."""
"""What π_rev may look at (``ModelConfig.revision_view``)."""

_WEIGHT_FIELDS = ("vlm_base", "init_adapter", "rev_adapter", "init_model", "rev_model", "segmenter")
_DEVICE = re.compile(r"cpu|cuda(:\d+)?|mps")
"""Device strings a models file may name (torch's spelling)."""

# Fields read as text whatever YAML made of them (a hub id or a device name may parse as a number)
_TEXT_FIELDS = _WEIGHT_FIELDS + (
    "rosalia",
    "device",
    "dtype",
    "segmenter_backend",
    "encode_precision",
    "revision_view",
    *_REFINEMENT_FIELDS,
)

DEMO_NAME = "xflow-demo-phantoms"
"""Name of the demo model (``monailabel_xflow/demo/``) in logs, traces and ``/info``."""
DEMO_NOTICE = (
    f"Using the XFlow demo model ({DEMO_NAME}): demo model trained on synthetic phantoms; not for clinical images."
)
"""The sentence every user of the demo model shows (log, ``/info``, traces)."""
DEMO_DIR = Path(__file__).resolve().parents[1] / "demo"
"""Folder of the committed demo weights (``models.yaml``, ``base/``, ``init/``, ``rev/``, ``segmenter/``)."""
DEMO_MODELS_FILE = DEMO_DIR / "models.yaml"
ENV_NO_DEMO = "XFLOW_NO_DEMO"
"""Environment variable that, set to a non-empty value other than ``0``, disables the demo fallback."""


class ModelConfigError(UnavailableError, ValueError):
    """The configuration is incomplete or names weights that are not available locally.

    The message says what to configure (which field / environment variable) or which command
    fetches the weights.
    """


@dataclass(frozen=True)
class ModelConfig:
    """Where XFlow's weights are and how to run them.

    Either ``vlm_base`` (with ``init_adapter`` and optionally ``rev_adapter``: one base model, two
    peft adapters, as served in production) or ``init_model`` (with optionally ``rev_model``: two
    merged models) must be given, and ``segmenter``. Without a revision policy
    (``rev_adapter`` / ``rev_model``) XFlow runs Stage 1 only.

    Attributes:
        vlm_base: base VLM folder or hub id (``AutoModelForImageTextToText`` + processor).
        init_adapter: π_init LoRA adapter folder or hub id (with ``vlm_base``).
        rev_adapter: π_rev LoRA adapter folder or hub id (with ``vlm_base``).
        init_model: merged π_init model (instead of ``vlm_base`` + ``init_adapter``).
        rev_model: merged π_rev model (with ``init_model``).
        segmenter: F_seg: a ``Sam3TrackerModel`` folder, an official ``sam3.pt`` file, or a hub id.
        segmenter_backend: ``"transformers"`` (default, CPU or GPU) or ``"official"`` (the
            ``sam3`` package, CUDA only).
        device: torch device string; None lets the loaders choose.
        dtype: dtype of the policy model, ``"float32"``, ``"bfloat16"`` or ``"float16"``; None
            lets the loader choose (float32 on CPU, bfloat16 on CUDA). The segmenter always
            picks its own.
        encode_precision: F_seg's image encoder arithmetic (``weights.ENCODE_PRECISIONS``; None:
            float32). ``bfloat16`` (autocast) is faster on CPUs with bfloat16 units but its masks
            drift from float32's (``benchmarks/bench_encode.py``), so it is asked for, not assumed.
        click_refinement: ``"brs"`` makes F_seg's masks agree with a person's clicks by
            backpropagation at inference (:mod:`monailabel_xflow.segmenter.refine`; the click tool,
            ``xflow_revise``), ``"none"`` (default) answers with the model alone. The transformers
            backend only.
        stage2_click_refinement: the same for π_rev's clicks in Stage 2 (default ``"none"``). Set it
            only for a π_rev trained on refined revisions: π_rev learns when clicking pays from the
            masks its clicks produced in training.
        stage2_stop_bias: logits added to π_rev's choice to stop, at every Stage 2 turn (default
            0: π_rev as trained). A positive bias makes π_rev stop unless a click is
            ``exp(bias)`` times likelier than stopping: a threshold chosen on a dev seed for a
            π_rev that clicks where clicking does not pay (``policy.vlm.VLMPolicy``; bounded by
            ``policy.base.MAX_STOP_BIAS``).
        stage1_presence_bias: logits added to π_init's choice to answer "absent" (default 0:
            π_init as trained). A negative bias makes Stage 1 answer "present" unless absence is
            ``exp(-bias)`` times likelier: the operating point of the presence decision, chosen on
            a dev seed (``policy.vlm.presence_decision_ids``; bounded by ``policy.base.MAX_STOP_BIAS``).
        max_clicks: Stage 2 budget T (default 4, as in the paper; ``policy.base.check_budget``).
        revision_view: what π_rev looks at, the view its adapter was trained on: ``"full"`` (the
            whole image, default) or ``"zoom"`` (a window around the box that prompted the mask,
            ``geometry.zoom_view``).
        max_new_tokens: cap on the tokens a policy generates per call (per Stage 2 turn);
            None keeps the policy's default.
        rosalia: the ROSALIA baseline's folder or hub id (the app's ``rosalia`` task); not one
            of XFlow's weights.
        base_dir: folder relative paths are resolved against (the config file's folder).
    """

    vlm_base: str | None = None
    init_adapter: str | None = None
    rev_adapter: str | None = None
    init_model: str | None = None
    rev_model: str | None = None
    segmenter: str | None = None
    segmenter_backend: str = "transformers"
    device: str | None = None
    dtype: str | None = None
    encode_precision: str | None = None
    click_refinement: str = "none"
    stage2_click_refinement: str = "none"
    stage2_stop_bias: float = 0.0
    stage1_presence_bias: float = 0.0
    max_clicks: int = MAX_CLICKS
    revision_view: str = "full"
    max_new_tokens: int | None = None
    rosalia: str | None = None
    base_dir: str | None = None

    def __post_init__(self) -> None:
        if self.segmenter_backend not in BACKENDS:
            raise ModelConfigError(f"segmenter_backend {self.segmenter_backend!r} is not one of {', '.join(BACKENDS)}")
        if self.device is not None:
            _check_spelling(self.device)  # the machine's devices are checked at load (check_device)
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ModelConfigError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.encode_precision is not None and self.encode_precision not in ENCODE_PRECISIONS:
            raise ModelConfigError(
                f"encode_precision {self.encode_precision!r} is not one of {', '.join(ENCODE_PRECISIONS)}"
            )
        for name in _REFINEMENT_FIELDS:
            value = getattr(self, name)
            if value not in CLICK_REFINEMENTS:
                raise ModelConfigError(f"{name} {value!r} is not one of {', '.join(CLICK_REFINEMENTS)}")
            if value != "none" and self.segmenter_backend != "transformers":
                raise ModelConfigError(f"{name} needs segmenter_backend: transformers")
        for name in ("stage2_stop_bias", "stage1_presence_bias"):
            try:
                bias = check_stop_bias(getattr(self, name), name)
            except PolicyError as err:
                raise ModelConfigError(str(err)) from err
            object.__setattr__(self, name, bias)
        if self.revision_view not in REVISION_VIEWS:
            raise ModelConfigError(f"revision_view {self.revision_view!r} is not one of {', '.join(REVISION_VIEWS)}")
        try:
            clicks = check_budget(self.max_clicks)
        except BudgetError as err:
            raise ModelConfigError(str(err)) from err
        object.__setattr__(self, "max_clicks", clicks)
        if self.max_new_tokens is not None:
            try:
                tokens = int(self.max_new_tokens)
            except (TypeError, ValueError) as err:
                raise ModelConfigError(f"max_new_tokens must be an integer, got {self.max_new_tokens!r}") from err
            if tokens < 1:
                raise ModelConfigError(f"max_new_tokens must be >= 1, got {tokens}")
            object.__setattr__(self, "max_new_tokens", tokens)

    # --- sources --------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base_dir: str | os.PathLike[str] | None = None) -> ModelConfig:
        """Build from a mapping with the field names as keys (None values are ignored).

        Raises:
            ModelConfigError: unknown keys or bad values.
        """
        if not isinstance(data, Mapping):
            raise ModelConfigError(f"a model configuration is a mapping, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ModelConfigError(f"unknown model configuration key(s) {unknown}; known: {', '.join(sorted(known))}")
        values = {k: v for k, v in data.items() if v is not None}
        for key in _TEXT_FIELDS:
            if key in values:
                values[key] = str(values[key])
        if base_dir is not None and "base_dir" not in values:
            values["base_dir"] = str(base_dir)
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ModelConfig:
        """Read a YAML (``.yaml``/``.yml``) or JSON file; relative paths resolve against its folder.

        Raises:
            ModelConfigError: missing or unreadable file, bad contents.
        """
        path = Path(path).expanduser()
        if not path.is_file():
            raise ModelConfigError(f"model configuration file {str(path)!r} does not exist")
        text = path.read_text()
        try:
            if path.suffix.lower() in (".yaml", ".yml"):
                import yaml

                data = yaml.safe_load(text) or {}
            else:
                data = json.loads(text)
        except Exception as err:  # yaml.YAMLError / json.JSONDecodeError: report, do not guess
            raise ModelConfigError(f"cannot read model configuration {str(path)!r}: {err}") from err
        return cls.from_dict(data, base_dir=path.resolve().parent)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ModelConfig:
        """``XFLOW_MODELS`` (a file), then ``XFLOW_<FIELD>`` variables overriding it field by field."""
        env = os.environ if environ is None else environ
        config = cls.from_file(env[ENV_FILE]) if env.get(ENV_FILE) else cls()
        overrides: dict[str, Any] = {}
        for f in fields(cls):
            value = env.get(ENV_PREFIX + f.name.upper())
            if value not in (None, "") and f.name != "base_dir":
                overrides[f.name] = value
        if not overrides:
            return config
        merged = {k: v for k, v in asdict(config).items() if v is not None}
        merged.update(overrides)
        return cls.from_dict(merged)

    @classmethod
    def load(cls, source: ModelConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None) -> ModelConfig:
        """Any supported source: a config, a dict, a file path, or None for the environment.

        None reads the environment and, when that names no weights, falls back to the demo model
        (:func:`default_config`).
        """
        if isinstance(source, ModelConfig):
            return source
        if source is None:
            return default_config()[0]
        if isinstance(source, Mapping):
            return cls.from_dict(source)
        if isinstance(source, (str, os.PathLike)):
            return cls.from_file(source)
        raise ModelConfigError(f"cannot build a model configuration from {type(source).__name__}")

    # --- checks and resolution --------------------------------------------------------------

    def validate(self) -> None:
        """Check that the fields form a runnable combination (not that the weights exist).

        Raises:
            ModelConfigError: naming what to set.
        """
        if self.vlm_base and self.init_model:
            raise ModelConfigError("set either vlm_base (+ adapters) or init_model (merged models), not both")
        if not (self.vlm_base or self.init_model):
            raise ModelConfigError(
                "no policy model configured: set vlm_base (with init_adapter / rev_adapter) or init_model "
                "(with rev_model) in the models file (--models) or XFLOW_VLM_BASE / XFLOW_INIT_MODEL"
            )
        if self.init_model and (self.init_adapter or self.rev_adapter):
            raise ModelConfigError("adapters go with vlm_base; with merged models use init_model / rev_model")
        if self.vlm_base and self.rev_model:
            raise ModelConfigError("rev_model goes with init_model; with vlm_base use rev_adapter")
        if not self.segmenter:
            raise ModelConfigError(
                "no segmenter configured: set segmenter (a Sam3TrackerModel folder, a sam3.pt file or a hub "
                "id) in the models file (--models) or XFLOW_SEGMENTER"
            )

    @property
    def is_demo(self) -> bool:
        """Whether this is the committed demo model (its file's folder is :data:`DEMO_DIR`)."""
        return self.base_dir is not None and Path(self.base_dir).resolve() == DEMO_DIR

    @property
    def has_reviser(self) -> bool:
        """Whether a revision policy (Stage 2) is configured."""
        return bool(self.rev_adapter or self.rev_model)

    def weights(self) -> dict[str, str]:
        """The configured weight fields, ``{field: value}`` (unresolved)."""
        return {k: getattr(self, k) for k in _WEIGHT_FIELDS if getattr(self, k)}

    def identities(self) -> dict[str, str]:
        """What a trace records about the models: the weight fields as configured, plus settings."""
        ids = self.weights()
        ids["segmenter_backend"] = self.segmenter_backend
        if self.is_demo:
            ids["demo"] = DEMO_NOTICE
        if self.device:
            ids["device"] = self.device
        if self.dtype:
            ids["dtype"] = self.dtype
        if self.encode_precision:
            ids["encode_precision"] = self.encode_precision
        for name in _REFINEMENT_FIELDS:
            if getattr(self, name) != "none":
                ids[name] = getattr(self, name)
        for name in ("stage2_stop_bias", "stage1_presence_bias"):
            if getattr(self, name):
                ids[name] = f"{getattr(self, name):g}"
        return ids

    def locate(self, value: str) -> tuple[str, Path | None]:
        """Classify a weight value without touching the network.

        Returns:
            ``("local", path)`` for an existing path, ``("hub", None)`` for a hub id.

        Raises:
            ModelConfigError: a ``./``-style or absolute path that does not exist, or a value
                that is neither a path nor a hub id.
        """
        candidate = Path(value).expanduser()
        places = (
            [candidate]
            if candidate.is_absolute()
            else ([Path(self.base_dir) / candidate] if self.base_dir else []) + [candidate]
        )
        for place in places:
            if place.exists():
                return "local", place.resolve()
        explicit_path = candidate.is_absolute() or value.startswith(("./", "../", "~"))
        if explicit_path or not is_hub_id(value):
            tried = ", ".join(str(p) for p in places)
            raise ModelConfigError(f"{value!r} is not an existing path (tried {tried}) nor a hub id 'org/name'")
        return "hub", None

    def resolve(self, field_name: str) -> Path:
        """The local path of a configured weight field, from disk or from the hub cache only.

        Raises:
            ModelConfigError: the field is unset, or its hub id is not in the local cache (the
                message names ``xflow weights pull``).
        """
        value = getattr(self, field_name)
        if not value:
            raise ModelConfigError(
                f"{field_name} is not configured (set it in --models or {ENV_PREFIX}{field_name.upper()})"
            )
        kind, path = self.locate(value)
        if kind == "local":
            assert path is not None
            return path
        repo_id, revision = split_hub_id(value)
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
        except (LocalEntryNotFoundError, FileNotFoundError, OSError) as err:
            raise ModelConfigError(
                f"{field_name} = {value!r} is not in the local Hugging Face cache; run "
                f"`xflow weights pull{' --models CONFIG' if self.base_dir else ''}` to download it "
                f"(or point {field_name} at a local folder)"
            ) from err

    def with_overrides(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (None values ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


SERVER_OVERRIDES = ("encode_precision", "click_refinement")
"""Fields a server's ``--conf`` may set over the models file (``runtime.XFlowRuntime``)."""


def hub_ids(config: ModelConfig) -> dict[str, str]:
    """``{field: hub id}`` of the configured weights that are not local paths."""
    out = {}
    for name, value in config.weights().items():
        kind, _ = config.locate(value)
        if kind == "hub":
            out[name] = value
    return out


# --- the demo default -----------------------------------------------------------------------


def demo_config() -> ModelConfig | None:
    """The committed demo model's configuration, or None when its folder is not installed.

    The demo (``monailabel_xflow/demo/models.yaml``) is a small XFlow trained on synthetic phantoms
    (:data:`DEMO_NOTICE`); :meth:`ModelConfig.is_demo` is True for it.
    """
    if not DEMO_MODELS_FILE.is_file():
        return None
    return ModelConfig.from_file(DEMO_MODELS_FILE)


def demo_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``XFLOW_NO_DEMO`` turns the demo fallback off."""
    env = os.environ if environ is None else environ
    return env.get(ENV_NO_DEMO, "") not in ("", "0")


def default_config(environ: Mapping[str, str] | None = None) -> tuple[ModelConfig, str]:
    """The configuration used when no ``--models`` is given, and where it came from.

    The environment (``XFLOW_MODELS`` / ``XFLOW_*``) when it names any weights; otherwise the demo
    model (logged with :data:`DEMO_NOTICE`) unless ``XFLOW_NO_DEMO`` is set or the demo is not
    installed, in which case the empty environment configuration (its :meth:`~ModelConfig.validate`
    says what to set).

    Returns:
        ``(config, source)``, source ``"XFLOW_MODELS=PATH"``, ``"XFLOW_*"`` or ``"demo"``.
    """
    env = os.environ if environ is None else environ
    config = ModelConfig.from_env(env)
    source = f"{ENV_FILE}={env[ENV_FILE]}" if env.get(ENV_FILE) else f"{ENV_PREFIX}*"
    if config.weights() or demo_disabled(env):
        return config, source
    demo = demo_config()
    if demo is None:
        return config, source
    # keep settings given in the environment (device, dtype, max clicks...) on top of the demo
    settings = {
        k: v for k, v in asdict(config).items() if v is not None and k != "base_dir" and v != getattr(ModelConfig(), k)
    }
    demo = replace(demo, **settings) if settings else demo
    logger.info("no models configured (--models, XFLOW_*): using the demo model in %s", DEMO_DIR)
    return demo, "demo"


# --- loading --------------------------------------------------------------------------------


@dataclass
class LoadedModels:
    """What :func:`load_models` returns: the two policies (or one serving both), the segmenter."""

    stage1: Stage1Policy
    reviser: RevisionPolicy | None
    segmenter: PromptableSegmenter
    identities: dict[str, str]


def load_models(config: ModelConfig) -> LoadedModels:
    """Load the policies and the segmenter a configuration names, from local files only.

    With ``vlm_base`` one :class:`~monailabel_xflow.policy.vlm.VLMPolicy` holds the base and both
    adapters and serves as π_init and π_rev; with merged models, one policy per model.

    Raises:
        ModelConfigError: incomplete configuration, a device this machine lacks, weights not
            available locally, or weights that do not load (a folder of another model kind).
    """
    config.validate()
    check_device(config.device)
    if config.is_demo:
        logger.warning(DEMO_NOTICE)
    # Resolve every path first: a missing weight fails before minutes of loading.
    paths = {name: config.resolve(name) for name in config.weights()}
    try:
        return _load(config, paths)
    except XFlowError:
        raise  # already says what is wrong
    except (OSError, ValueError) as err:  # a folder of another kind (a segmenter as vlm_base), a bad file
        raise ModelConfigError(f"cannot load the configured weights: {type(err).__name__}: {err}") from err


def check_device(device: str | None) -> None:
    """Refuse a device this machine does not have (a GPU models file copied onto a CPU install).

    Raises:
        ModelConfigError: a device string torch does not spell, or naming the device and what
            the machine has.
    """
    if not device or device == "cpu":
        return
    _check_spelling(device)
    import torch

    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            raise ModelConfigError(
                f"device {device} is configured but this machine has {count} CUDA GPU(s): set device: cpu "
                "(or leave it out) in the models file"
            )
    elif device == "mps" and not torch.backends.mps.is_available():
        raise ModelConfigError("device mps is configured but this machine has no Apple GPU: set device: cpu")


def _check_spelling(device: str) -> None:
    if not _DEVICE.fullmatch(str(device)):
        raise ModelConfigError(f"device {device!r} is not cpu, cuda, cuda:N or mps")


def _load(config: ModelConfig, paths: Mapping[str, Path]) -> LoadedModels:
    """:func:`load_models` once the configuration is checked and its paths resolved."""
    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy
    from monailabel_xflow.segmenter.loading import load_segmenter

    kwargs: dict[str, Any] = {
        "device": config.device,
        "dtype": config.dtype,
        "zoom": config.revision_view == "zoom",
        "stop_bias": config.stage2_stop_bias,
        "presence_bias": config.stage1_presence_bias,
    }
    if config.max_new_tokens is not None:
        kwargs["generation"] = GenerationSettings(max_new_tokens=config.max_new_tokens)
    if config.vlm_base:
        logger.info(
            "loading VLM %s with adapters %s",
            paths["vlm_base"],
            [str(paths[k]) for k in ("init_adapter", "rev_adapter") if k in paths],
        )
        policy = VLMPolicy.from_pretrained(
            str(paths["vlm_base"]),
            init_adapter=str(paths["init_adapter"]) if "init_adapter" in paths else None,
            rev_adapter=str(paths["rev_adapter"]) if "rev_adapter" in paths else None,
            **kwargs,
        )
        stage1, reviser = policy, (policy if "rev_adapter" in paths else None)
    else:
        logger.info("loading merged policy models %s / %s", paths["init_model"], paths.get("rev_model"))
        stage1 = VLMPolicy.from_pretrained(str(paths["init_model"]), **kwargs)
        reviser = None
        if "rev_model" in paths:
            same = paths["rev_model"] == paths["init_model"]
            reviser = stage1 if same else VLMPolicy.from_pretrained(str(paths["rev_model"]), **kwargs)
    if reviser is None:
        logger.warning("no revision policy configured (rev_adapter / rev_model): XFlow runs Stage 1 only")
    logger.info("loading segmenter %s (%s)", paths["segmenter"], config.segmenter_backend)
    segmenter = load_segmenter(
        str(paths["segmenter"]),
        backend=config.segmenter_backend,
        device=config.device,
        encode_precision=config.encode_precision,
        refinement=refinement_for(config.stage2_click_refinement),
    )
    return LoadedModels(stage1, reviser, segmenter, config.identities())


__all__ = [
    "ModelConfig",
    "ModelConfigError",
    "LoadedModels",
    "load_models",
    "hub_ids",
    "is_hub_id",
    "split_hub_id",
    "DEMO_NAME",
    "DEMO_NOTICE",
    "DEMO_DIR",
    "DEMO_MODELS_FILE",
    "ENV_NO_DEMO",
    "demo_config",
    "demo_disabled",
    "default_config",
]
