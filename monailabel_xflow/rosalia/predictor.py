"""ROSALIA's stateful predictor: set an image once, ask it many instructions.

:class:`RosaliaPredictor` is ROSALIA's counterpart of XFlow's workflow for one image::

    predictor = RosaliaPredictor.from_pretrained("path/to/rosalia")
    predictor.set_image(image)                       # (H, W) in [0, 1] or uint8, or (H, W, 3)
    mask, answer, trace = predictor.predict("Segment the effusion in the left lung.")

``set_image`` prepares the image as the public ROSALIA code does at inference, as given (no
histogram equalisation: the released ``inference_rosalia_example.py`` and evaluation loader read
the file and hand its pixels on; equalisation is a training augmentation, p = 0.5), and computes
the SAM embedding and the CLIP pixels once; each ``predict`` tokenises the prompt as the reference
does (:func:`~monailabel_xflow.rosalia.templates.reference_ids`), runs one greedy generation and one
single-mask decoding. Instructions are read with XFlow's parser
(:func:`~monailabel_xflow.instructions.parse_instruction`) and ROSALIA is asked the canonical
instruction; the answer the user gets is XFlow's sentence for the same decision, with ``[SEG]``
hidden (:mod:`monailabel_xflow.rosalia.templates`).

Decision: the finding is *present* when the decoded mask is not empty (how the papers score
ROSALIA's negatives); the sentence comes from the model's text when that fits the instruction's
templates, otherwise from the mask alone (the trace records the disagreement).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from monailabel_xflow.instructions import Instruction, parse_instruction
from monailabel_xflow.rosalia.model import EncodedImage, RosaliaError, RosaliaModel
from monailabel_xflow.rosalia.templates import canonical_sentence, read_answer
from monailabel_xflow.weights import choose_device

logger = logging.getLogger(__name__)

TRACE_FORMAT = "rosalia-trace/1"


class RosaliaPredictor:
    """One ROSALIA model and the current image (one caller at a time, like ``SamPredictor``).

    Args:
        model: a loaded :class:`RosaliaModel`.
        max_new_tokens: cap of the generated answer (ROSALIA's sentences are < 20 tokens).
        identity: what traces record as the model (its folder, "demo"...).
        equalise: histogram-equalise images before encoding. Off, as in the public inference and
            evaluation code; on reproduces the research snapshots, whose evaluation read
            pre-equalised PNGs.
    """

    def __init__(
        self,
        model: RosaliaModel,
        max_new_tokens: int = 32,
        identity: dict[str, str] | None = None,
        equalise: bool = False,
    ) -> None:
        self.model = model.eval()
        self.equalise = bool(equalise)
        self.max_new_tokens = int(max_new_tokens)
        self.identity = dict(identity or {})
        self._image: EncodedImage | None = None
        self._embedding: torch.Tensor | None = None

    @classmethod
    def from_pretrained(
        cls, path: str | Path, device: str | None = None, dtype: str | None = None, **kwargs: Any
    ) -> RosaliaPredictor:
        """Load a ROSALIA folder (:meth:`RosaliaModel.from_pretrained`) onto ``device``.

        Args:
            path: the folder.
            device: torch device string; default CUDA when available, else CPU.
            dtype: ``"float32"`` / ``"bfloat16"`` / ``"float16"``; default float32.
        """
        dev = choose_device(device)
        torch_dtype = getattr(torch, dtype) if dtype else None
        model = RosaliaModel.from_pretrained(path, device=dev, dtype=torch_dtype)
        kwargs.setdefault("identity", {"rosalia": str(path)})
        return cls(model, **kwargs)

    # --- the image ------------------------------------------------------------------------------

    def set_image(self, image: np.ndarray) -> None:
        """Encode ``image`` for both branches (equalised only with ``equalise``); later questions
        reuse the work.

        Raises:
            SegmenterInputError: an image that is not ``(H, W)`` / ``(H, W, 3)`` uint8 or float in [0, 1].
        """
        encoded = self.model.encoder.image(image, equalise=self.equalise)
        with torch.inference_mode():
            self._embedding = self.model.image_embeddings(encoded.sam_pixels[None])
        self._image = encoded

    # --- questions ------------------------------------------------------------------------------

    def predict(self, instruction: Instruction | str) -> tuple[np.ndarray, str, dict[str, Any]]:
        """Answer one instruction about the current image.

        Args:
            instruction: an :class:`Instruction` or free text naming one finding.

        Returns:
            ``(mask, answer, trace)``: ``(H, W)`` bool mask (logits > 0) at the image's size; the
            answer sentence ("" for a present basic instruction); a JSON-ready trace (raw text,
            decision, timings, problems).

        Raises:
            RosaliaError: no image set.
            InstructionError: text that is not one supported instruction.
        """
        if self._image is None or self._embedding is None:
            raise RosaliaError("set_image() first")
        instr = instruction if isinstance(instruction, Instruction) else parse_instruction(instruction)
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        model, image = self.model, self._image
        enc = model.encoder.text(instr.text)
        dev = model.device
        with torch.inference_mode():
            out = model.llava.generate(
                input_ids=enc.input_ids[None].to(dev),
                attention_mask=torch.ones_like(enc.input_ids)[None].to(dev),
                pixel_values=image.clip_pixels[None].to(dev, model.llava.dtype),
                do_sample=False,
                max_new_tokens=self.max_new_tokens,
                output_hidden_states=True,
                return_dict_in_generate=True,
            )
            new_ids = out.sequences[0, enc.input_ids.shape[0] :]
            timings["generate_s"] = time.perf_counter() - t0
            seg_steps = (new_ids == model.seg_token_id).nonzero().flatten().tolist()
            mask = np.zeros(image.original, bool)
            if seg_steps:
                # The state that *predicts* [SEG] (LISA's input_ids[:, 1:] == seg): at step k the
                # last layer's last position; step 0 is the prompt's last token.
                hidden = out.hidden_states[seg_steps[0]][-1][:, -1]
                t1 = time.perf_counter()
                low = model.decode_masks(self._embedding, model.text_hidden_fcs(hidden))
                logits = model.postprocess(low[0], image.resized, image.original)
                mask = (logits > 0).cpu().numpy()
                timings["decode_s"] = time.perf_counter() - t1
        text = model.tokenizer.decode(new_ids, skip_special_tokens=False)
        text = text.replace(model.tokenizer.eos_token, "").strip()
        read = read_answer(text, instr)
        present = bool(mask.any())
        problems = list(read.problems)
        if read.says_present is not None and read.says_present != present:
            problems.append(
                f"the text says {'present' if read.says_present else 'absent'} but the mask is "
                f"{'not ' if present else ''}empty; the mask decides"
            )
        if present and read.says_present:
            answer = read.sentence
        else:
            answer = canonical_sentence(instr, present)
        timings["total_s"] = time.perf_counter() - t0
        trace = {
            "format": TRACE_FORMAT,
            "model": "rosalia",
            "identity": self.identity,
            "instruction": instr.to_dict(),
            "raw_text": text,
            "seg_tokens": len(seg_steps),
            "present": present,
            "text_says_present": read.says_present,
            "answer": answer,
            "mask_pixels": int(mask.sum()),
            "image_size": list(image.original),
            "timings": timings,
            "problems": problems,
        }
        return mask, answer, trace


__all__ = ["RosaliaPredictor", "TRACE_FORMAT"]
