"""The ``xflow`` entry point: cheap to import, sub-commands discovered, instruction command."""

import json
import subprocess
import sys
from pathlib import Path

from monailabel_xflow.cli import main


def test_package_import_is_cheap():
    code = (
        "import sys, monailabel_xflow, monailabel_xflow.cli as c; c.build_parser(); "
        "heavy = [m for m in ('torch', 'monai', 'monailabel', 'transformers') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_instruction_prints_canonical_json(capsys):
    assert main(["instruction", "is there fluid on the left?"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == [
        {
            "instruction": "Segment the effusion in the left lung.",
            "finding": "effusion",
            "regions": ["left lung"],
            "level": "lung",
            "kind": "basic",
        }
    ]


def test_instruction_error_exits_2(capsys):
    assert main(["instruction", "pneumothorax please"]) == 2
    err = capsys.readouterr().err
    assert "pneumothorax" in err and "effusion" in err


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "xflow"  # installed beside the interpreter
    out = subprocess.run([str(exe), "instruction", "segment all findings"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)) == 7
