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


# --- hostile and malformed datasets (an audit of every reader; each case crashed or read a file
# outside the dataset before) ----------------------------------------------------------------


def _with_study(path, **changes):
    """The release of :func:`build_mimic` with study s1 changed; returns its path."""
    release = json.loads(path.read_text())
    release["test"]["s1"].update(changes)
    out = path.with_name("changed.json")
    out.write_text(json.dumps(release))
    return out


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"image_path": 123}, "image_path must be a non-empty path, got 123"),
        ({"image_path": None}, "image_path must be a non-empty path, got None"),
        ({"instruction_answer_pairs": [1, 2]}, "instruction_answer_pairs must be an object"),
        ({"instruction_answer_pairs": {"positive_pairs": {"a": 1}}}, "positive_pairs must be a list"),
        ({"instruction_answer_pairs": {"positive_pairs": ["x"]}}, "positive_pairs[0]: a pair must be an object"),
    ],
)
def test_a_bad_mimic_study_is_a_problem_naming_it(tmp_path, changes, says):
    path, root = build_mimic(tmp_path)
    result = read_mimic_ils(_with_study(path, **changes), root)
    assert not any(c.meta["study"] == "s1" for c in result.cases)
    assert any(p.startswith("study s1") and says in p for p in result.problems), result.problems


def test_a_bad_mimic_pair_is_a_problem_naming_it(tmp_path):
    path, root = build_mimic(tmp_path)
    release = json.loads(path.read_text())
    positives = release["test"]["s1"]["instruction_answer_pairs"]["positive_pairs"]
    positives[0]["type"] = "Global"  # a typo, not a choice: left out without a word before
    positives[1]["seg_mask_path"] = "../../../etc/hostname"
    positives[3]["type"] = ["basic"]
    negatives = release["test"]["s1"]["instruction_answer_pairs"]["negative_pairs"]
    negatives[0]["pair_id"] = 0  # an id, not a missing one
    path.write_text(json.dumps(release))
    result = read_mimic_ils(path, root)
    assert [c.case_id for c in result.cases] == ["s1_0"]
    positives[0]["type"], positives[1]["seg_mask_path"], positives[1]["seg"] = "global", "s1/effusion_left.png", "false"
    path.write_text(json.dumps(release))
    assert [c.case_id for c in read_mimic_ils(path, root).cases] == ["s1_000", "s1_0"]  # "false" is no mask
    problems = "\n".join(result.problems)
    assert "positive_pairs[0]: type 'Global' is none of basic, global, lesion_inference" in problems
    assert "positive_pairs[1]: seg_mask_path '../../../etc/hostname' is not inside" in problems
    assert "positive_pairs[3]: type ['basic'] is none of" in problems


@pytest.mark.parametrize(
    "content, says",
    [
        ('{"test": [1]}', "split 'test' must be an object keyed by study, got list"),
        ('{"test": null}', "split 'test' must be an object keyed by study, got NoneType"),
        ("[1]", "expected an object keyed by split (train/val/test), got list"),
        (b'{"test": "\xe9"}', "is not valid UTF-8 JSON"),
    ],
)
def test_a_badly_shaped_release_is_one_error(tmp_path, content, says):
    path = tmp_path / "r.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DatasetError) as err:
        read_mimic_ils(path)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_folder_masks_stay_inside_and_a_latin1_table_is_named(tmp_path):
    """A ground-truth mask outside the set was scored as truth; images may lie anywhere."""
    folder = tmp_path / "set"
    save_png(folder / "img01.png", np.zeros((8, 8), np.uint8))
    save_png(tmp_path / "outside.png", np.full((8, 8), 255, np.uint8))
    (folder / "instructions.csv").write_text(
        "image,mask,instruction\n"
        "img01.png,../outside.png,Segment the edema.\n"
        f"img01.png,{tmp_path / 'outside.png'},Segment the effusion.\n"
        "../outside.png,,Segment the edema.\n"
    )
    result = read_folder(folder)
    assert [c.image_path for c in result.cases] == [folder / "../outside.png"]
    assert len(result.problems) == 2 and all("is not inside" in p for p in result.problems)
    save_png(folder / "m.png", np.full((8, 8), 255, np.uint8))  # an absolute path inside the set is fine
    (folder / "instructions.csv").write_text(f"image,mask,instruction\nimg01.png,{folder / 'm.png'},edema\n")
    assert [c.mask_path for c in read_folder(folder).cases] == [folder / "m.png"]
    (folder / "instructions.csv").write_bytes(
        "image,mask,instruction\nimg01.png,,edema in the l\xe9ft lung\n".encode("latin-1")
    )
    with pytest.raises(DatasetError, match="is not UTF-8 .*save it as UTF-8"):
        read_folder(folder)


def test_a_chexlocalize_id_stays_inside_its_root(tmp_path):
    save_png(tmp_path / "img" / "a.png", np.zeros((8, 8), np.uint8))
    save_png(tmp_path / "b.png", np.zeros((8, 8), np.uint8))
    empty = rle.encode(np.zeros((8, 8), bool))
    (tmp_path / "gt.json").write_text(json.dumps({"a": {"Edema": empty}, "../b": {"Edema": empty}}))
    result = read_chexlocalize(tmp_path / "gt.json", tmp_path / "img")
    assert [c.meta["image_id"] for c in result.cases] == ["a"]
    assert result.problems == [f"image ../b: image id '../b' is not inside {tmp_path / 'img'}"]


def test_an_image_given_as_a_mask_is_refused(tmp_path):
    """Swapped image and mask columns: the radiograph was read as a lesion over 93 % of it."""
    save_png(tmp_path / "cxr.png", np.random.default_rng(0).integers(0, 256, (32, 32), dtype=np.uint8))
    with pytest.raises(DatasetError, match="grey levels, so it looks like an image"):
        read_mask_png(tmp_path / "cxr.png")
    labels = np.zeros((32, 32), np.uint8)
    labels[2:5, 2:5], labels[10:12, 10:12] = 1, 2  # a label map with a few values is a mask
    save_png(tmp_path / "labels.png", labels)
    assert read_mask_png(tmp_path / "labels.png").sum() == 13
