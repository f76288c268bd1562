"""Readers of MIMIC-ILS, CheXlocalize and folder datasets, on fixtures built here."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow import rle
from monailabel_xflow.data.readers import (
    CHEXLOCALIZE_FINDINGS,
    DatasetError,
    read_chexlocalize,
    read_dataset,
    read_folder,
    read_mask_png,
    read_mimic_ils,
    safe_case_id,
)


def save_png(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def pair(pair_id, text, kind, target, location, mask=None):
    return {
        "pair_id": pair_id,
        "instruction": text,
        "answer": "",
        "type": kind,
        "target": target,
        "location": location,
        "sent_idx": 0,
        "seg": mask is not None,
        "seg_mask_path": mask,
    }


def build_mimic(tmp_path):
    """A two-study release; the second study's image is missing and one mask file is missing."""
    root = tmp_path / "mimic-cxr-jpg"
    save_png(root / "files/p10/s1/img1.jpg", np.full((16, 16), 80, np.uint8))  # JPEG, as in MIMIC-CXR-JPG
    gt = tmp_path / "release"
    mask = np.zeros((8, 8), np.uint8)
    mask[2:5, 1:4] = 255
    save_png(gt / "lesion_mask/s1/effusion_left.png", mask)
    release = {
        "train": {},
        "test": {
            "s1": {
                "subject_id": "10",
                "dicom_id": "img1",
                "image_path": "files/p10/s1/img1.jpg",
                "section_name": "findings",
                "section_content": "Left effusion.",
                "instruction_answer_pairs": {
                    "positive_pairs": [
                        pair(
                            "s1_000",
                            "Segment the effusion.",
                            "global",
                            "effusion",
                            ["left lung base"],
                            "s1/effusion_left.png",
                        ),
                        pair(
                            "s1_001",
                            "Segment the effusion in the left lung.",
                            "basic",
                            "effusion",
                            ["left lung"],
                            "s1/effusion_left.png",
                        ),
                        pair(
                            "s1_002",
                            "Segment the effusion in the left lung base.",
                            "basic",
                            "effusion",
                            ["left lung base"],
                            "s1/missing.png",
                        ),
                        pair(
                            "s1_003",
                            "Segment the opacity in the left lung base and predict its type.",
                            "lesion_inference",
                            "pneumonia",
                            ["left lung base"],
                            "s1/effusion_left.png",
                        ),
                    ],
                    "negative_pairs": [
                        pair("s1_004", "Segment the edema in the right lung.", "basic", "edema", ["right lung"]),
                        pair("s1_005", "Segment the unicorn.", "global", "unicorn", []),
                    ],
                },
            },
            "s2": {
                "subject_id": "11",
                "dicom_id": "img2",
                "image_path": "files/p11/s2/img2.jpg",
                "instruction_answer_pairs": {"positive_pairs": [], "negative_pairs": []},
            },
        },
    }
    path = gt / "mimic_ils.json"
    path.write_text(json.dumps(release))
    return path, root


def test_mimic_ils_reads_valid_pairs_and_lists_problems(tmp_path):
    path, root = build_mimic(tmp_path)
    result = read_mimic_ils(path, root)
    ids = [c.case_id for c in result.cases]
    assert ids == ["s1_000", "s1_001", "s1_004"]
    chest, lung, neg = result.cases
    assert (chest.level, chest.finding, chest.positive) == ("chest", "effusion", True)
    assert (lung.level, lung.instruction.regions) == ("lung", ("left lung",))
    assert (neg.positive, neg.mask_path, neg.load_mask()) == (False, None, None)
    mask = lung.load_mask()
    assert mask.dtype == bool and mask.shape == (8, 8) and mask.sum() == 9
    assert lung.meta["subject_id"] == "10" and lung.image_path == root / "files/p10/s1/img1.jpg"
    text = "\n".join(result.problems)
    assert "img2.jpg" in text and "missing.png" in text and "unicorn" in text
    assert len(result.problems) == 3
    assert result.skipped == {"type lesion_inference": 1}
    with pytest.raises(DatasetError, match="3 problem"):
        read_mimic_ils(path, root, strict=True)
    # lesion inference on request
    li = read_mimic_ils(path, root, kinds=("lesion_inference",))
    assert [c.instruction.kind for c in li.cases] == ["lesion_inference"]
    with pytest.raises(DatasetError, match="no split"):
        read_mimic_ils(path, root, split="validation")


def test_mimic_ils_spec_and_default_root(tmp_path):
    path, root = build_mimic(tmp_path)
    assert len(read_dataset(f"mimic-ils:{path}:{root}").cases) == 3
    # without ROOT the JSON's folder (then the one above) is searched: images are elsewhere here
    result = read_dataset(f"mimic-ils:{path}")
    assert not result.cases and any("not found" in p for p in result.problems)


def test_chexlocalize_maps_findings_and_empty_rle_is_negative(tmp_path):
    root = tmp_path / "images"
    save_png(root / "patient1/study1/view1_frontal.png", np.zeros((6, 5), np.uint8))  # CheXpert layout, PNG
    Image.fromarray(np.zeros((6, 5), np.uint8)).save(root / "patient2_study1_view1_frontal.jpg")
    lesion = np.zeros((6, 5), bool)
    lesion[1:3, 2:4] = True
    data = {
        "patient1_study1_view1_frontal": {
            "Pleural Effusion": rle.encode(lesion),
            "Airspace Opacity": rle.encode(np.zeros((6, 5), bool)),
            "Support Devices": rle.encode(lesion),
            "Edema": {"size": [6, 5], "counts": "1"},  # sums to 1, not 30
        },
        "patient2_study1_view1_frontal": {"Cardiomegaly": rle.encode(lesion)},
        "patient3_study1_view1_frontal": {"Edema": rle.encode(lesion)},
    }
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(data))
    result = read_chexlocalize(path, root)
    by_id = {c.case_id: c for c in result.cases}
    assert set(by_id) == {
        "patient1_study1_view1_frontal_effusion",
        "patient1_study1_view1_frontal_opacity",
        "patient2_study1_view1_frontal_cardiomegaly",
    }
    eff = by_id["patient1_study1_view1_frontal_effusion"]
    assert eff.positive and eff.level == "chest" and eff.instruction.text == "Segment the effusion."
    np.testing.assert_array_equal(eff.load_mask(), lesion)
    assert eff.image_path.name == "view1_frontal.png"
    opa = by_id["patient1_study1_view1_frontal_opacity"]
    assert not opa.positive and opa.load_mask() is None
    assert result.skipped == {"pathology Support Devices": 1}
    assert len(result.problems) == 2  # bad RLE, missing image
    assert set(CHEXLOCALIZE_FINDINGS.values()) == {
        "opacity",
        "atelectasis",
        "cardiomegaly",
        "consolidation",
        "edema",
        "effusion",
    }
    assert len(read_dataset(f"chexlocalize:{path}:{root}").cases) == 3


def test_folder_format(tmp_path):
    save_png(tmp_path / "img01.png", np.zeros((8, 8), np.uint8))
    m = np.zeros((8, 8, 3), np.uint8)
    m[1, 1] = (0, 255, 0)  # colour masks: any channel counts
    save_png(tmp_path / "masks/img01_eff.png", m)
    (tmp_path / "instructions.csv").write_text(
        "image,mask,instruction\n"
        "img01.png,masks/img01_eff.png,Segment the effusion in the left lung.\n"
        "img01.png,,Segment the edema.\n"
        "missing.png,,Segment the edema.\n"
        "img01.png,masks/nope.png,Segment the edema.\n"
        "img01.png,,Segment the pneumothorax.\n"
    )
    result = read_folder(tmp_path)
    assert [c.case_id for c in result.cases] == ["img01__effusion_in_the_left_lung", "img01__edema"]
    pos, neg = result.cases
    assert pos.positive and pos.load_mask().sum() == 1 and pos.level == "lung"
    assert not neg.positive and neg.level == "chest"
    assert len(result.problems) == 3
    assert "missing.png" in result.problems[0] and "nope.png" in result.problems[1]
    with pytest.raises(DatasetError):
        read_folder(tmp_path, strict=True)
    with pytest.raises(DatasetError, match="instructions.csv"):
        read_folder(tmp_path / "masks")


def test_duplicate_case_ids_are_reported(tmp_path):
    save_png(tmp_path / "a.png", np.zeros((4, 4), np.uint8))
    (tmp_path / "instructions.csv").write_text("image,mask,instruction\na.png,,Segment the edema.\na.png,,edema\n")
    result = read_folder(tmp_path)
    assert result.cases == [] and "duplicate" in result.problems[0]


def test_bad_spec_and_helpers(tmp_path):
    for spec in ("nifti:/x", "chexlocalize:/only-json", "folder:", "mimic-ils:a:b:c"):
        with pytest.raises(DatasetError, match="bad dataset spec"):
            read_dataset(spec)
    assert safe_case_id("a b/c:d") == "a_b_c_d"
    with pytest.raises(DatasetError, match="cannot read mask"):
        read_mask_png(tmp_path / "none.png")
