"""What a phantom benchmark folder holds: content identities of its data and models, and the
manifest (``OUT/manifest.json``) that refuses a rerun into a folder made for another benchmark.

The manifest records the split, seed, question count, phantom size, a content hash of the phantoms
and questions (:func:`data_identity`), and a content hash of each model (:func:`content_identity`,
:func:`xflow_content_identity`); :func:`check_manifest` refuses an ``OUT`` made with another seed,
count, size or data (results and drawings are keyed by case id, so reusing them would score other
images), as it refuses a test-split rerun with other models. :func:`stage1_identity` keys the Stage 1
text cache by what a Stage 1 text depends on.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from monailabel_xflow.data.readers import EvalCase
from monailabel_xflow.errors import InputError
from monailabel_xflow.eval.phantom_protocol import BASELINES, DEV_SEED, MANIFEST_FORMAT, MANIFEST_NAME, METHODS

__all__ = [
    "BenchmarkOutError",
    "stage1_identity",
    "content_identity",
    "xflow_content_identity",
    "data_identity",
    "check_manifest",
    "write_manifest",
]

log = logging.getLogger(__name__)


class BenchmarkOutError(InputError):
    """An ``--out`` folder that holds another benchmark (other seed, size, questions, data or
    test-split models) than the one asked for."""


def stage1_identity(cfg: Any) -> str:
    """A content hash of what a Stage 1 text depends on: π_init's weights (base + adapter, or the
    merged model), the decoding length and the presence bias, not F_seg or π_rev.

    The Stage 1 text cache (``OUT/stage1-texts.jsonl``) is keyed by it, so a benchmark rerun after
    only F_seg or π_rev changed reuses the texts (greedy decoding gives the same text), while a
    retrained π_init, even copied elsewhere, is recognised by its bytes.

    Args:
        cfg: a :class:`~monailabel_xflow.workflow.model_config.ModelConfig`.
    """
    digest = hashlib.sha256(f"max_new_tokens={getattr(cfg, 'max_new_tokens', None)}".encode())
    bias = getattr(cfg, "stage1_presence_bias", 0.0)
    if bias:  # unbiased texts keep the identity they had before the setting existed
        digest.update(f"stage1_presence_bias={bias!r}".encode())
    for name in ("vlm_base", "init_adapter", "init_model"):
        value = getattr(cfg, name, None)
        if not value:
            continue
        _, path = cfg.locate(value)
        digest.update(f"{name}={value if path is None else ''}".encode())
        if path is not None:  # a hub id enters as its text
            _hash_files(digest, path)
    return digest.hexdigest()[:16]


def _hash_files(digest: Any, path: Path, skip_suffixes: tuple[str, ...] = ()) -> None:
    """Feed the names (relative to ``path``) and bytes of a file or a folder's files to ``digest``
    (a folder's files ending in one of ``skip_suffixes`` left out)."""
    files = (
        sorted(f for f in path.rglob("*") if f.is_file() and not f.name.endswith(skip_suffixes))
        if path.is_dir()
        else [path]
    )
    for f in files:
        digest.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        digest.update(hashlib.sha256(f.read_bytes()).digest())


def content_identity(*paths: str | Path) -> str:
    """A content hash of files and folders (names and bytes, not times): the same for a copy or a
    fresh checkout, new for any changed byte. A folder's Markdown files (its model card) are left
    out: documentation is not the model. A path that does not exist enters as its text."""
    digest = hashlib.sha256()
    for p in paths:
        p = Path(p)
        digest.update(str(p.name).encode())
        if p.exists():
            _hash_files(digest, p, skip_suffixes=(".md",))
        else:
            digest.update(f"absent:{p}".encode())
    return digest.hexdigest()[:16]


def xflow_content_identity(config: str | Path) -> str:
    """:func:`content_identity` of a models file and every local weight folder it names."""
    from monailabel_xflow.workflow.model_config import ModelConfig

    cfg = ModelConfig.load(config)
    paths: list[str | Path] = [config]
    for value in cfg.weights().values():
        _, path = cfg.locate(value)
        paths.append(path if path is not None else str(value))
    return content_identity(*paths)


def data_identity(heldout: Path, cases: Sequence[EvalCase]) -> str:
    """A content hash of the questions file and of every image and GT mask the cases use."""
    paths: list[Path] = [heldout]
    for c in cases:
        paths.append(c.image_path)
        if c.mask_path is not None:
            paths.append(c.mask_path)
    digest = hashlib.sha256()
    for p in dict.fromkeys(paths):
        digest.update(p.name.encode())
        digest.update(hashlib.sha256(p.read_bytes()).digest())
    return digest.hexdigest()[:16]


def check_manifest(out: Path, wanted: Mapping[str, Any]) -> dict[str, Any]:
    """Refuse an ``out`` made for another benchmark; return the manifest to write.

    ``wanted`` holds ``split``, ``seed``, ``questions``, ``size`` (and, once the data exist,
    ``data``; once the models are known, ``models``: ``{name: content identity}``). A folder
    without a manifest is accepted only while it holds no phantoms and no results. The dev split
    accepts other models (their records are redone); the test split does not: it is scored once.

    Raises:
        BenchmarkOutError: what differs, and what to do.
    """
    path = out / MANIFEST_NAME
    if not path.is_file():
        if (out / "data").exists() or any((out / m / "results.jsonl").exists() for m in METHODS + BASELINES):
            raise BenchmarkOutError(
                f"{out} holds a benchmark without {MANIFEST_NAME} (made before the manifest "
                "existed, or by hand): its phantoms and results cannot be checked; use a new --out"
            )
        return {"format": MANIFEST_FORMAT, **wanted}
    stored: dict[str, Any] = json.loads(path.read_text())
    for key in ("split", "seed", "questions", "size", "data"):
        if key in wanted and key in stored and stored[key] != wanted[key]:
            raise BenchmarkOutError(
                f"{out} was made with {key} {stored[key]!r}, this run asks {wanted[key]!r}: its "
                "phantoms and results are of another benchmark; use a new --out"
            )
    models = dict(stored.get("models", {}))
    for name, identity in wanted.get("models", {}).items():
        if name in models and models[name] != identity:
            if stored.get("split") == "test":
                raise BenchmarkOutError(
                    f"{out} is a test-split run scored with another {name} model ({models[name]}, "
                    f"now {identity}); the test seed is scored once, with the models chosen on "
                    f"the dev seed: compare models on --seed {DEV_SEED} instead"
                )
            log.warning("benchmark: %s model changed (%s -> %s); its records are redone", name, models[name], identity)
        models[name] = identity
    return {**stored, **{k: v for k, v in wanted.items() if k != "models"}, "models": models}


def write_manifest(out: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``OUT/manifest.json`` (creating ``out``); ``manifest`` as :func:`check_manifest` returned it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")
