"""``xflow weights``: see where the configured weights are, download them when asked, merge
the policies' adapters for serving.

Usage::

    xflow weights show [--models CONFIG]
    xflow weights pull [--models CONFIG] [--token TOKEN] [--dry-run] [REPO_ID[@REVISION] ...]
    xflow weights merge [--models CONFIG] --out DIR [--dtype float32|bfloat16|float16]

``show`` lists each configured weight (``vlm_base``, adapters, merged models, ``segmenter``)
and whether it is a local path, in the local Hugging Face cache, or missing; it never touches
the network. ``pull`` is the only place XFlow downloads anything: it calls
``huggingface_hub.snapshot_download`` for the given hub ids, or for every configured value
that is a hub id, printing each one it fetches and where it landed. The token is ``--token``,
else whatever ``huggingface_hub`` finds (``HF_TOKEN``, ``hf auth login``); gated models
(MedGemma, SAM3) need one whose account accepted their licence.

``merge`` turns a base-plus-adapters configuration into two merged policy models
(:mod:`monailabel_xflow.policy.merging`): ``DIR/init`` and ``DIR/rev``, and ``DIR/models.yaml``
naming them as ``init_model`` / ``rev_model`` with every other setting of CONFIG kept. It reads
local weights only (``pull`` first) and refuses an existing ``DIR``.

Exit status: 0 ok, 2 bad configuration (``show``: one that names too little to run) or
repository id, 1 a download failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from monailabel_xflow.weights import DTYPES

MODELS_HELP = "model configuration (YAML/JSON); default: XFLOW_* variables, else the demo model"


def register(subparsers) -> None:
    parser = subparsers.add_parser("weights", help="show, download (pull) or merge the configured model weights")
    actions = parser.add_subparsers(dest="weights_action", metavar="ACTION", required=True)

    show = actions.add_parser("show", help="where each configured weight is (no network)")
    show.add_argument("--models", "-m", help=MODELS_HELP)
    show.set_defaults(func=run)

    pull = actions.add_parser("pull", help="download hub weights into the local Hugging Face cache")
    pull.add_argument(
        "repo_ids", nargs="*", metavar="REPO_ID", help="hub ids (org/name[@revision]); default: the config's"
    )
    pull.add_argument("--models", "-m", help=MODELS_HELP)
    pull.add_argument("--token", help="Hugging Face token (default: HF_TOKEN or the saved login)")
    pull.add_argument("--dry-run", action="store_true", help="print what would be fetched, fetch nothing")
    pull.set_defaults(func=run)

    merge = actions.add_parser("merge", help="merge π_init's and π_rev's adapters into two plain models")
    merge.add_argument("--models", "-m", help=MODELS_HELP)
    merge.add_argument("--out", required=True, help="new folder for the merged models and their models.yaml")
    merge.add_argument("--dtype", choices=DTYPES, help="saved weights' dtype (default: the base's)")
    merge.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from monailabel_xflow.workflow.model_config import ModelConfig, ModelConfigError

    # `pull REPO_ID ...` alone needs no configuration; every other form reads one
    named_ids = args.weights_action == "pull" and args.repo_ids
    try:
        config = ModelConfig.load(args.models) if (args.models or not named_ids) else None
    except ModelConfigError as err:
        return _error(str(err))
    if args.weights_action == "show":
        return _show(config)
    if args.weights_action == "merge":
        return _merge(args, config)
    return _pull(args, config)


def _show(config) -> int:
    from monailabel_xflow.workflow.model_config import ModelConfigError

    weights = config.weights()
    if not weights:
        print("no weights configured (set --models or XFLOW_VLM_BASE / XFLOW_SEGMENTER ...)")
        return 0
    if config.is_demo:
        print("the demo model (synthetic phantoms only; set --models or XFLOW_* for real weights)")
    for name, value in weights.items():
        try:
            status = f"ready: {config.resolve(name)}"
        except ModelConfigError as err:
            status = f"MISSING: {err}"
        print(f"{name:13s} {value}\n{'':13s} {status}")
    try:
        config.validate()
    except ModelConfigError as err:
        print(f"not runnable: {err}")
        return 2
    return 0


def _pull(args: argparse.Namespace, config) -> int:
    from monailabel_xflow.weights import is_hub_id, split_hub_id
    from monailabel_xflow.workflow.model_config import ModelConfigError, hub_ids

    if args.repo_ids:
        wanted = {f"argument {k + 1}": value for k, value in enumerate(args.repo_ids)}
        for value in wanted.values():
            if not is_hub_id(value):
                return _error(f"{value!r} is not a hub id of the form org/name[@revision]")
    else:
        try:
            wanted = hub_ids(config)
        except ModelConfigError as err:
            return _error(str(err))
        if not wanted:
            print("nothing to pull: no configured weight is a hub id (local paths are used as they are)")
            return 0
    fetch = list(dict.fromkeys(wanted.values()))  # one download per id, in order
    if args.dry_run:
        for value in fetch:
            print(f"would fetch {value}")
        return 0

    from huggingface_hub import snapshot_download

    for value in fetch:
        repo_id, revision = split_hub_id(value)
        print(f"fetching {repo_id}" + (f" at {revision}" if revision else "") + " ...", flush=True)
        try:
            path = snapshot_download(repo_id, revision=revision, token=args.token)
        except Exception as err:  # network, authentication, gated repository: report and stop
            return _error(f"download of {value} failed: {type(err).__name__}: {err}", status=1)
        print(f"  -> {path}", flush=True)
    return 0


MERGED = {"init_adapter": ("init_model", "init"), "rev_adapter": ("rev_model", "rev")}
"""Each adapter field, the merged-model field that replaces it, and its folder under ``--out``."""


def _merge(args: argparse.Namespace, config) -> int:
    from dataclasses import asdict

    import yaml

    from monailabel_xflow.policy.base import PolicyError
    from monailabel_xflow.policy.merging import merge_adapter
    from monailabel_xflow.workflow.model_config import ModelConfig, ModelConfigError

    out = Path(args.out)
    if out.exists():
        return _error(f"{out} exists; merge writes a new folder and never overwrites")
    try:
        config.validate()
        if not config.vlm_base:
            return _error("the configuration already names merged models (init_model); there is nothing to merge")
        base = config.resolve("vlm_base")
        adapters = {field: config.resolve(field) for field in MERGED if getattr(config, field)}
        # the other weights, as absolute local paths (the new file lives elsewhere) or hub ids
        kept: dict[str, str] = {}
        for name in ("segmenter", "rosalia"):
            if value := getattr(config, name):
                kind, path = config.locate(value)
                kept[name] = str(path) if kind == "local" else value
    except ModelConfigError as err:
        return _error(str(err))
    values, defaults = asdict(config), asdict(ModelConfig())
    settings = {
        name: value
        for name, value in values.items()
        if name not in {"base_dir", "vlm_base", *MERGED, *kept} and value is not None and value != defaults[name]
    }
    written: dict[str, str] = {}
    try:
        for field, (merged_field, folder) in MERGED.items():
            if field in adapters:
                print(f"merging {adapters[field]} into {base} ...", flush=True)
                merge_adapter(base, adapters[field], out / folder, dtype=args.dtype)
                written[merged_field] = f"./{folder}"
    except PolicyError as err:
        return _error(str(err))
    models = out / "models.yaml"
    header = f"# {', '.join(written)} merged by `xflow weights merge` from {config.base_dir or 'XFLOW_* variables'}\n"
    models.write_text(header + yaml.safe_dump({**written, **kept, **settings}, sort_keys=False))
    print(f"wrote {', '.join(str(out / f.removeprefix('./')) for f in written.values())} and {models}")
    print(f"serve them with: xflow serve --studies DIR --models {models}")
    return 0


def _error(message: str, status: int = 2) -> int:
    print(f"xflow weights: error: {message}", file=sys.stderr)
    return status
