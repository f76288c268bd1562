"""Bad numbers and paths on the command line: refused before any work, in one line naming the
option, with exit status 2 (argparse's, or the command's), and nothing left behind."""

from __future__ import annotations

import pytest

from monailabel_xflow.cli import main

SAMPLE = "sample-data/phantom_1_00006.png"
DATASET = "mimic-ils:sample-data/ground-truth/mimic_ils.json"


def _status(argv: list[str]) -> int:
    """The exit status ``xflow ARGV`` gives: what ``main`` returns, or argparse's ``SystemExit``."""
    try:
        return main(argv)
    except SystemExit as stop:
        return int(stop.code or 0)


@pytest.fixture(autouse=True)
def no_models(monkeypatch):
    monkeypatch.setenv("XFLOW_NO_DEMO", "1")  # nothing may load a model before the check


BOUNDS = [
    ("eval --dataset {ds} --out {tmp}/e --limit -1", "--limit: must be >= 1, got -1"),
    ("eval --dataset {ds} --out {tmp}/e --limit 0", "--limit: must be >= 1, got 0"),
    ("build init-sft --dataset {ds} --out {tmp}/b --chunk-size 0", "--chunk-size: must be >= 1"),
    ("build init-rl --dataset {ds} --out {tmp}/b --seed -1", "--seed: must be >= 0"),
    ("phantom --out {tmp}/p --size 100000", "--size: must be in 128..4096, got 100000"),
    ("phantom --out {tmp}/p --seed -1", "--seed: must be in 0..999999999"),
    ("benchmark phantom --out {tmp}/bp --size 10", "--size: must be in 128..4096"),
    ("benchmark phantom --out {tmp}/bp --seed -1", "--seed: must be in 0..999999999"),
    ("benchmark clicks --out {tmp}/bc --seed -1", "--seed: must be in 0..999999999"),
    ("benchmark clicks --out {tmp}/bc --max-clicks 17", "--max-clicks: must be in 1..16"),
    ("benchmark clicks --out {tmp}/bc --device bogus", "device 'bogus' is not cpu, cuda"),
    ("train init-sft --data {tmp}/d --model {tmp}/m --out {tmp}/t --max-steps 0", "--max-steps: must be >= 1"),
    ("train demo --quick --out {tmp}/t --set init_sft_steps=-5", "init_sft_steps must be >= 0"),
    ("train demo --quick --out {tmp}/t --seed -1", "seed must be >= 0"),
    ("train rosalia-demo --quick --out {tmp}/t --steps -3", "steps must be >= 1, got -3"),
    ("train rosalia --model {tmp}/m --data {ds} --out {tmp}/t --steps -1", "steps must be >= 1"),
    ("segment {img} -i effusion --out {tmp}/s --max-clicks 100000", "--max-clicks: max_clicks"),
    ("preannotate --studies http://127.0.0.1:9/dicom-web --max-clicks 99", "--max-clicks: max_clicks"),
]


def _argv(command: str, tmp_path) -> list[str]:
    return command.format(ds=DATASET, img=SAMPLE, tmp=tmp_path, file=tmp_path / "taken.txt").split()


@pytest.mark.parametrize(("command", "says"), BOUNDS, ids=[c for c, _ in BOUNDS])
def test_out_of_range_numbers_are_refused_before_any_work(command, says, tmp_path, capsys):
    assert _status(_argv(command, tmp_path)) == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []  # nothing written, no folder to refuse later


PATHS = [
    ("phantom --out {file} --count 1 --size 128", "is a file, not a folder"),
    ("build init-sft --dataset {ds} --out {file}", "is a file, not a folder"),
    ("eval --dataset {ds} --model {tmp}/m.yaml --out {file}", "is a file, not a folder"),
    ("build init-sft --dataset {ds} --out {tmp}/b --lung-boxes {tmp}/no.json", "is not a file"),
]


@pytest.mark.parametrize(("command", "says"), PATHS, ids=[c for c, _ in PATHS])
def test_a_path_of_the_wrong_kind_is_named(command, says, tmp_path, capsys):
    (tmp_path / "taken.txt").write_text("mine")
    assert _status(_argv(command, tmp_path)) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert (tmp_path / "taken.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == [
        "taken.txt"
    ]


@pytest.mark.parametrize(
    "command, usage",
    [
        ("segment {sample} -i effusion -o {tmp}/s --bogus", "usage: xflow segment "),
        ("benchmark clicks --out {tmp}/bc --bogus 3", "usage: xflow benchmark clicks "),
        ("weights show --bogus", "usage: xflow weights show "),
        ("train demo --out {tmp}/t --bogus", "usage: xflow train demo "),
    ],
)
def test_an_unknown_option_is_refused_with_its_commands_usage(command, usage, tmp_path, capsys):
    """Not with the top-level "usage: xflow [-h] [--version] COMMAND ...", which hides the options
    the user could have meant."""
    argv = command.format(sample=SAMPLE, tmp=tmp_path).split()
    assert _status(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(usage) and "error: unrecognized arguments: --bogus" in err
    assert not list(tmp_path.iterdir())  # nothing written


def _folder_set(tmp_path, mask_bytes: bytes | None = None):
    """``folder:`` dataset of one sample image, a negative and (with ``mask_bytes``) a positive."""
    import shutil

    folder = tmp_path / "set"
    folder.mkdir()
    shutil.copy(SAMPLE, folder / "img01.png")
    rows = "img01.png,,Segment the edema.\n"
    if mask_bytes is not None:
        (folder / "m.png").write_bytes(mask_bytes)
        rows += "img01.png,m.png,Segment the effusion in the left lung.\n"
    (folder / "instructions.csv").write_text("image,mask,instruction\n" + rows)
    return f"folder:{folder}"


@pytest.mark.parametrize(
    "kind, lung_boxes, mask, says",
    [
        # 0 rows and exit 0 before: the builder's own refusal was never reached
        ("init-sft", None, None, "init-sft needs lung boxes"),
        ("init-sft", "{not json", None, "--lung-boxes"),
        ("init-sft", "[1, 2]", None, "expected {image: {lung: [x1, y1, x2, y2]}}"),
        ("init-sft", '{"img01.png": {"right lung": "abc"}}', None, "'abc' is not a normalised xyxy box"),
        ("init-sft", '{"img01.png": {"middle lung": [0, 0, 1, 1]}}', None, "must map right lung / left lung"),
        ("init-rl", None, b"not a png", "cannot read mask"),  # a traceback, with finding-masks/ left behind
    ],
)
def test_build_refuses_what_it_cannot_build_in_one_line(tmp_path, capsys, kind, lung_boxes, mask, says):
    spec = _folder_set(tmp_path, mask)
    argv = ["build", kind, "--dataset", spec, "--out", str(tmp_path / "out")]
    if lung_boxes is not None:
        (tmp_path / "boxes.json").write_text(lung_boxes)
        argv += ["--lung-boxes", str(tmp_path / "boxes.json")]
    assert _status(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.json"))


def test_build_of_an_empty_split_is_refused(tmp_path, capsys):
    (tmp_path / "r.json").write_text('{"train": {}}')
    assert (
        _status(["build", "init-rl", "--dataset", f"mimic-ils:{tmp_path / 'r.json'}", "--out", str(tmp_path / "o")])
        == 2
    )
    assert "no usable cases" in capsys.readouterr().err and not (tmp_path / "o").exists()
