"""The procedural chest radiograph phantom: determinism, ground truth, export formats."""

from __future__ import annotations

import json
from itertools import pairwise

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow.data.export import (
    GT_DIR,
    JSON_NAME,
    MASK_DIR,
    META_NAME,
    dicom_variant,
    export_set,
    quantize,
    study_ids,
)
from monailabel_xflow.data.phantom import CTR_NORMAL_MAX, PhantomError, cardiothoracic_ratio, generate_phantom
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS, LEFT_LUNG, LUNGS, RIGHT_LUNG, ZONES

SIZE = 256


@pytest.fixture(scope="module")
def phantoms():
    # every finding alone, a normal chest, and random draws
    out = [generate_phantom(100 + i, SIZE, findings=(f,)) for i, f in enumerate(FINDINGS)]
    out.append(generate_phantom(200, SIZE, findings=()))
    out += [generate_phantom(300 + s, SIZE) for s in range(6)]
    return out


def test_deterministic_and_seed_dependent():
    a, b, c = generate_phantom(5, SIZE), generate_phantom(5, SIZE), generate_phantom(6, SIZE)
    assert a.image.dtype == np.float32 and a.image.shape == (SIZE, SIZE)
    assert a.image.tobytes() == b.image.tobytes()
    assert [les.mask.tobytes() for les in a.lesions] == [les.mask.tobytes() for les in b.lesions]
    assert a.image.tobytes() != c.image.tobytes()
    assert a.image.min() >= 0.0 and a.image.max() <= 1.0


def test_every_finding_producible(phantoms):
    for f, ph in zip(FINDINGS, phantoms, strict=False):
        assert ph.findings == (f,)
        assert all(les.mask.any() for les in ph.lesions)


def test_masks_consistent(phantoms):
    for ph in phantoms:
        lungs = ph.lungs[RIGHT_LUNG] | ph.lungs[LEFT_LUNG]
        assert not (ph.lungs[RIGHT_LUNG] & ph.lungs[LEFT_LUNG]).any()
        assert not (ph.heart & lungs).any()
        # zones partition each lung exactly
        for lung in LUNGS:
            zs = [ph.zones[z] for z in ZONES[lung]]
            assert (np.sum(zs, axis=0) == ph.lungs[lung]).all()
            rows = [np.flatnonzero(z.any(axis=1)) for z in zs]
            assert all(r[-1] < s[0] for r, s in pairwise(rows))  # apex to base, no overlap
        for les in ph.lesions:
            if les.finding == "cardiomegaly":
                assert (les.mask == ph.heart).all() and les.zones == ()
                continue
            assert les.mask.any() and not (les.mask & ~ph.lungs[les.lung]).any()
            assert les.zones == tuple(z for z in ALL_ZONES if (les.mask & ph.zones[z]).any())
            if les.finding == "effusion":
                base = ZONES[les.lung][3]
                assert base in les.zones
                # dependent: the lung's lowest row is fluid
                lowest = np.flatnonzero(ph.lungs[les.lung].any(axis=1))[-1]
                assert les.mask[lowest].any()


def test_patient_left_on_image_right(phantoms):
    for ph in phantoms:
        cols = lambda m: np.flatnonzero(m.any(axis=0)).mean()  # noqa: E731
        assert cols(ph.lungs[LEFT_LUNG]) > SIZE / 2 > cols(ph.lungs[RIGHT_LUNG])
        assert np.flatnonzero(ph.heart.any(axis=0)).mean() > SIZE / 2  # heart leans to patient left
        # lungs are dark, the mediastinum bright
        lungs = ph.lungs[RIGHT_LUNG] | ph.lungs[LEFT_LUNG]
        assert ph.image[lungs].mean() < ph.image[ph.heart].mean() - 0.2


def test_cardiothoracic_ratio(phantoms):
    for ph in phantoms:
        assert ph.ctr == pytest.approx(cardiothoracic_ratio(ph.lungs, ph.heart))
        if "cardiomegaly" in ph.findings:
            assert ph.ctr > 0.5
        else:
            assert ph.ctr <= CTR_NORMAL_MAX
    for seed in range(12):  # AP magnification must not push normal hearts over the limit
        assert generate_phantom(seed, 128, findings=(), view="AP").ctr <= CTR_NORMAL_MAX
        assert generate_phantom(seed, 128, findings=("cardiomegaly",), view="PA").ctr > 0.5


def test_bad_arguments():
    with pytest.raises(PhantomError, match="pleural"):
        generate_phantom(0, SIZE, findings=("pleural",))
    with pytest.raises(PhantomError, match="size"):
        generate_phantom(0, 32)
    with pytest.raises(PhantomError, match="view"):
        generate_phantom(0, SIZE, view="LL")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("phantoms")
    release, phantoms = export_set(out, 8, seed=3, size=SIZE, dicom=True)
    return out, release, phantoms


def test_a_set_is_written_with_one_phantom_in_memory(tmp_path):
    """export_set keeps what the negatives need, not the pixels: the peak memory of writing 24
    phantoms is that of writing 4 (it grew by a phantom, ~1.3 MB at 256 px, per study), and the
    phantoms it hands back are drawn again, pixel for pixel those written."""
    import tracemalloc

    def peak(count: int) -> int:
        tracemalloc.start()
        try:
            export_set(tmp_path / f"n{count}", count, seed=4, size=256)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    one = generate_phantom(0, 256)
    phantom_bytes = one.image.nbytes + sum(m.nbytes for m in (*one.lungs.values(), *one.zones.values(), one.heart))
    few, many = peak(4), peak(24)
    assert many - few < 3 * phantom_bytes, (few, many, phantom_bytes)  # 20 phantoms more would be ~20
    _, phantoms = export_set(tmp_path / "again", 3, seed=4, size=256)
    assert len(phantoms) == 3 and len(phantoms[1:]) == 2
    with pytest.raises(IndexError):
        phantoms[3]
    written = np.asarray(Image.open(tmp_path / "again" / "phantom_4_00002.png"))
    assert np.array_equal(quantize(phantoms[-1].image)[1], written)


def test_study_ids_are_unique_per_seed(tmp_path):
    """Sets drawn with seeds 0 and 1000 (the demo's training and dev seeds) share no study, subject
    or mask folder: results and caches keyed by study cannot mix their phantoms."""
    ids = {seed: [study_ids(seed, i) for i in range(50)] for seed in (0, 1, 10, 1000, 10000)}
    studies = [s for v in ids.values() for s, _ in v]
    subjects = [p for v in ids.values() for _, p in v]
    assert len(set(studies)) == len(studies) and len(set(subjects)) == len(subjects)
    assert all(len(s) <= 16 for s in studies)  # DICOM StudyID
    a, _ = export_set(tmp_path / "a", 2, seed=0, size=128)
    b, _ = export_set(tmp_path / "b", 2, seed=1000, size=128)
    in_a = {s for split in a.values() for s in split}
    in_b = {s for split in b.values() for s in split}
    assert len(in_a) == len(in_b) == 2 and not in_a & in_b
    with pytest.raises(PhantomError, match="seed"):
        study_ids(-1, 0)


def _instruction_of(pair) -> Instruction:
    if pair["type"] == "global":
        return Instruction(pair["target"], (), "global")
    if pair["type"] == "lesion_inference":
        return Instruction("opacity", tuple(pair["location"]), "lesion_inference")
    return Instruction(pair["target"], tuple(pair["location"]))


def test_mimic_ils_json(exported):
    out, release, _ = exported
    on_disk = json.loads((out / GT_DIR / JSON_NAME).read_text())
    assert on_disk == json.loads(json.dumps(release))
    assert set(on_disk) == {"train", "val", "test"}
    studies = [st for split in on_disk.values() for st in split.values()]
    assert len(studies) == 8
    found = set()
    for st in studies:
        assert {
            "subject_id",
            "dicom_id",
            "image_path",
            "section_name",
            "section_content",
            "instruction_answer_pairs",
        } <= set(st)
        img = np.asarray(Image.open(out / st["image_path"]))
        pairs = st["instruction_answer_pairs"]
        for p in pairs["positive_pairs"] + pairs["negative_pairs"]:
            assert set(p) == {
                "pair_id",
                "instruction",
                "answer",
                "type",
                "target",
                "location",
                "sent_idx",
                "seg",
                "seg_mask_path",
            }
            assert p["type"] in ("basic", "global", "lesion_inference")
            ins = _instruction_of(p)
            assert p["instruction"] == ins.text
        for p in pairs["positive_pairs"]:
            found.add(p["target"])
            mask = np.asarray(Image.open(out / GT_DIR / MASK_DIR / p["seg_mask_path"]))
            assert mask.dtype == np.uint8 and mask.shape == img.shape
            assert set(np.unique(mask)) == {0, 255}
            assert p["seg"] is True
            ins = _instruction_of(p)
            if p["type"] == "global":
                assert p["answer"] == ins.located_answer(p["location"])
            elif p["type"] == "lesion_inference":
                assert p["answer"] in (ins.lesion_answer(p["target"], True), ins.lesion_answer(p["target"], False))
            else:
                assert p["answer"] == ""
        for p in pairs["negative_pairs"]:
            assert p["seg_mask_path"] is None and p["seg"] is False
            assert p["answer"] == _instruction_of(p).absent_answer()
    assert found == set(FINDINGS)  # 8 studies cover every finding


def test_zone_pairs_match_masks(exported):
    out, release, phantoms = exported
    meta = json.loads((out / GT_DIR / META_NAME).read_text())
    for m, ph in zip(meta, phantoms, strict=True):
        anatomy = np.asarray(Image.open(out / GT_DIR / m["anatomy"]))
        for k, z in enumerate(ALL_ZONES):
            assert ((anatomy == k + 1) == ph.zones[z]).all()
        st = next(s[m["study"]] for s in release.values() if m["study"] in s)
        for p in st["instruction_answer_pairs"]["positive_pairs"]:
            if p["type"] == "basic" and p["location"][0] in ALL_ZONES:
                mask = np.asarray(Image.open(out / GT_DIR / MASK_DIR / p["seg_mask_path"])) > 0
                inside = np.any([ph.zones[z] for z in p["location"]], axis=0)
                assert not (mask & ~inside).any()
                assert all((mask & ph.zones[z]).any() for z in p["location"])
        for p in st["instruction_answer_pairs"]["negative_pairs"]:
            if p["type"] == "global":
                assert p["target"] not in ph.findings
            for region in p["location"]:  # a negative is true: nothing of the target there
                assert not ph.finding_mask(p["target"], region).any()
                if p["type"] == "lesion_inference":  # and an opacity negative means no lesion at all
                    assert region in ALL_ZONES and region not in ph.occupied_zones()


def test_dicom_matches_png(exported):
    pydicom = pytest.importorskip("pydicom")
    out, release, _ = exported
    meta = json.loads((out / GT_DIR / META_NAME).read_text())
    seen = set()
    for i, m in enumerate(meta):
        png = np.asarray(Image.open(out / m["image"])).astype(np.int64)
        ds = pydicom.dcmread(out / m["dicom"]["path"])
        v = dicom_variant(i)
        seen.add((v.photometric, v.bits))
        assert ds.PhotometricInterpretation == v.photometric == m["dicom"]["photometric"]
        assert ds.ViewPosition in ("PA", "AP") and ds.Modality in ("CR", "DX")
        assert ds.SOPClassUID in ("1.2.840.10008.5.1.4.1.1.1.1", "1.2.840.10008.5.1.4.1.1.1")
        assert float(ds.PixelSpacing[0]) > 0 and float(ds.ImagerPixelSpacing[1]) > 0
        px = ds.pixel_array.astype(np.int64)
        top = (1 << int(ds.BitsStored)) - 1
        if ds.PhotometricInterpretation == "MONOCHROME1":
            px = top - px
        if ds.BitsStored == 12:
            px = (px * 255 + 2047) // 4095
        assert (px == png).all()
    assert seen == {("MONOCHROME1", 8), ("MONOCHROME1", 16), ("MONOCHROME2", 8), ("MONOCHROME2", 16)}


def test_load_cxr_reads_dicom_like_png(exported):
    loading = pytest.importorskip("monailabel_xflow.transforms.loading")
    out, _, _ = exported
    meta = json.loads((out / GT_DIR / META_NAME).read_text())
    for m in meta[:4]:
        a, _ = loading.load_cxr(out / m["image"])
        b, info = loading.load_cxr(out / m["dicom"]["path"])
        assert info["photometric_interpretation"] == m["dicom"]["photometric"]
        assert np.abs(a - b).max() <= 1.5 / 255  # both min-max scaled; 12-bit rounds to 8-bit


def test_command_writes_a_set(tmp_path, capsys):
    from monailabel_xflow.cli import main

    sheet = tmp_path / "sheet.png"
    assert (
        main(
            [
                "phantom",
                "--out",
                str(tmp_path / "set"),
                "--count",
                "2",
                "--seed",
                "4",
                "--size",
                "128",
                "--contact-sheet",
                str(sheet),
            ]
        )
        == 0
    )
    assert sorted(p.name for p in (tmp_path / "set").glob("*.png")) == ["phantom_4_00000.png", "phantom_4_00001.png"]
    assert (tmp_path / "set" / GT_DIR / JSON_NAME).is_file()
    assert np.asarray(Image.open(sheet)).ndim == 3
    with pytest.raises(SystemExit) as refused:  # argparse's own refusal, before any work
        main(["phantom", "--out", str(tmp_path / "bad"), "--count", "0"])
    assert refused.value.code == 2 and "--count" in capsys.readouterr().err


def test_committed_sample_data_is_consistent():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "sample-data"
    release = json.loads((root / GT_DIR / JSON_NAME).read_text())
    meta = json.loads((root / GT_DIR / META_NAME).read_text())
    targets = set()
    for split in release.values():
        for st in split.values():
            assert (root / st["image_path"]).is_file() and "/" not in st["image_path"]
            for p in st["instruction_answer_pairs"]["positive_pairs"]:
                assert (root / GT_DIR / MASK_DIR / p["seg_mask_path"]).is_file()
                targets.add(p["target"])
    assert targets == set(FINDINGS)
    assert any(not m["findings"] for m in meta)  # a normal chest
    assert {(m["dicom"]["photometric"], m["dicom"]["bits"]) for m in meta} == {
        ("MONOCHROME1", 8),
        ("MONOCHROME1", 16),
        ("MONOCHROME2", 8),
        ("MONOCHROME2", 16),
    }
    assert all((root / m["dicom"]["path"]).is_file() for m in meta)
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert size < 20 * 2**20


def test_the_set_wide_negative_rule_is_the_per_phantom_rule():
    """matched_negatives reads negative_allowed through one array per question (_AllowedIndex):
    the same answer for every phantom and every question the set's positives ask."""
    from monailabel_xflow.data.export import PhantomFacts, _AllowedIndex, negative_allowed, positive_pairs, set_phantom

    phantoms = [set_phantom(6, i, 128) for i in range(16)]
    facts = [PhantomFacts.of(ph) for ph in phantoms]
    questions = {ins.text: ins for i, ph in enumerate(phantoms) for ins, _ in positive_pairs(ph, f"s{i}", {})[0]}
    allowed = _AllowedIndex(facts)
    kinds = set()
    for ins in questions.values():
        assert allowed(ins).tolist() == [negative_allowed(f, ins) for f in facts], ins.text
        kinds.add(ins.kind)
    assert kinds == {"global", "basic", "lesion_inference"}
