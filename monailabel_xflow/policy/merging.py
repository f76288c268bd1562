"""A policy's LoRA adapter merged into its base model: one plain checkpoint per policy.

The models file serves π_init and π_rev either as one base with two adapters (``vlm_base``,
``init_adapter``, ``rev_adapter``: one copy of the weights, the LoRA matmuls at every token) or as
two merged models (``init_model``, ``rev_model``: two copies, no adapter work). On a GPU the merged
π_init decodes about 25 % faster per token at MedGemma-4B shapes (``benchmarks/README.md``, "On a
GPU"). :func:`merge_adapter` writes such a model; ``xflow weights merge`` writes both and the
models file that serves them.

The merge runs in float32 and casts once to the saved dtype, so a bfloat16 base is rounded once,
not at each of the adapter's additions.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from monailabel_xflow.policy.base import PolicyError
from monailabel_xflow.policy.vlm import check_transformers
from monailabel_xflow.weights import DTYPES

MERGE_RECORD = "xflow_merged.json"
"""What each merged folder records about its making (base, adapter, dtype, library versions)."""


def stored_dtype(base: str | os.PathLike[str]) -> str:
    """The dtype a base checkpoint's ``config.json`` says its weights are stored in (float32 if
    it says none)."""
    from transformers import AutoConfig

    value = getattr(AutoConfig.from_pretrained(str(base)), "dtype", None)
    name = str(value).removeprefix("torch.") if value is not None else "float32"
    return name if name in DTYPES else "float32"


def merge_adapter(
    base: str | os.PathLike[str],
    adapter: str | os.PathLike[str],
    out: str | os.PathLike[str],
    dtype: str | None = None,
) -> Path:
    """Merge a peft LoRA adapter (and the module copies it saves, e.g. a trained vision tower)
    into its base and save the result, with the base's processor, as a plain checkpoint.

    Args:
        base: local folder of the ``AutoModelForImageTextToText`` base and its processor.
        adapter: local folder of a peft adapter trained on that base.
        out: folder to create; it must not exist (a merge never overwrites). The checkpoint is
            written beside it and renamed into place, so an interrupted merge leaves no ``out``.
        dtype: the saved weights' dtype (:data:`~monailabel_xflow.weights.DTYPES`); None keeps the base's.

    Returns:
        ``out``, loadable as ``init_model`` / ``rev_model`` of a models file.

    Raises:
        PolicyError: ``out`` exists, an unknown dtype, or a base or adapter that is not a folder.
    """
    check_transformers()
    out = Path(out)
    if out.exists():
        raise PolicyError(f"{out} exists; a merge writes a new folder and never overwrites")
    for name, path in (("base", base), ("adapter", adapter)):
        if not Path(path).is_dir():
            raise PolicyError(f"{name} {path} is not a folder")
    save_dtype = dtype or stored_dtype(base)
    if save_dtype not in DTYPES:
        raise PolicyError(f"dtype {save_dtype!r} is not one of {', '.join(DTYPES)}")

    import peft
    import transformers
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(str(base), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter), is_trainable=False).merge_and_unload()
    merged.to(getattr(torch, save_dtype))
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # what an earlier interrupted merge left
    merged.save_pretrained(partial)
    AutoProcessor.from_pretrained(str(base)).save_pretrained(partial)
    record = {
        "base": str(Path(base).resolve()),
        "adapter": str(Path(adapter).resolve()),
        "dtype": save_dtype,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }
    (partial / MERGE_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    partial.rename(out)
    return out
