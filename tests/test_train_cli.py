"""``xflow train``: argument handling and a plain call of each kind of trainer (tiny models)."""

from __future__ import annotations

import csv
import json

import pytest
from test_training_sft import EFFUSION, init_sft_rows, phantom_cases

from monailabel_xflow import cli


def test_help_lists_the_trainers(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for name in ("segmenter", "init-sft", "rev-sft", "init-rl", "rev-rl", "--init-from", "accelerate launch"):
        assert name in text


def test_bad_input_exits_2_with_the_reason(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("learning_rat: 0.1\n")
    data = tmp_path / "data"
    data.mkdir()
    assert (
        cli.main(
            [
                "train",
                "init-sft",
                "--data",
                str(data),
                "--model",
                "m",
                "--out",
                str(tmp_path / "o"),
                "--config",
                str(bad),
            ]
        )
        == 2
    )
    assert "learning_rat" in capsys.readouterr().err
    assert cli.main(["train", "rev-rl", "--data", str(data), "--model", "m", "--out", str(tmp_path / "o")]) == 2
    assert "--segmenter" in capsys.readouterr().err
    assert (
        cli.main(["train", "init-sft", "--data", str(tmp_path / "nope"), "--model", "m", "--out", str(tmp_path / "o")])
        == 2
    )
    assert "does not exist" in capsys.readouterr().err


def test_init_sft_plain_call_writes_an_adapter(tiny_vlm, tmp_path, capsys):
    from datasets import Dataset

    data = tmp_path / "data"
    Dataset.from_list(init_sft_rows(tmp_path / "img", 2)).save_to_disk(str(data))
    cfg = tmp_path / "small.yaml"
    cfg.write_text("effective_batch: 2\nlora_r: 4\nlora_alpha: 8\nlearning_rate: 1.0e-3\n")
    out = tmp_path / "out"
    status = cli.main(
        [
            "train",
            "init-sft",
            "--data",
            str(data),
            "--model",
            str(tiny_vlm.base),
            "--out",
            str(out),
            "--config",
            str(cfg),
            "--max-steps",
            "2",
            "--no-progress",
        ]
    )
    assert status == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["rows"] == 2 and summary["config"]["lora_r"] == 4
    assert (out / "adapter_config.json").is_file() and (out / "xflow_training.json").is_file()


def test_segmenter_plain_call_reads_a_dataset_spec(tiny_sam3, tmp_path, capsys):
    folder = tmp_path / "set"
    cases = phantom_cases(folder, 2)
    with (folder / "instructions.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image", "mask", "instruction"])
        for _, img, mask in cases:
            w.writerow([img, mask or "", EFFUSION.text])
    cfg = tmp_path / "seg.yaml"
    cfg.write_text("effective_batch: 1\n")
    out = tmp_path / "out"
    status = cli.main(
        [
            "train",
            "segmenter",
            "--data",
            f"folder:{folder}",
            "--model",
            str(tiny_sam3),
            "--out",
            str(out),
            "--config",
            str(cfg),
            "--max-steps",
            "1",
            "--no-progress",
        ]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["samples"] >= 1 and (out / "xflow_training.json").is_file()
