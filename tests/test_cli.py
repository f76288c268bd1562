"""The ``xflow`` entry point: cheap to import, sub-commands discovered, instruction command."""

import json
import subprocess
import sys
from pathlib import Path

from sources import package_files

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


def test_train_help_lists_every_trainer_and_recipe_and_each_parses(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    listed = capsys.readouterr().out
    for name in ("segmenter", "init-sft", "rev-sft", "init-rl", "rev-rl", "demo", "rosalia", "rosalia-demo"):
        assert f"\n    {name}" in listed  # a sub-command line of its own, not a word in the prose
    for recipe, flag in (("demo", "--set KEY=VALUE"), ("rosalia", "--lora-r"), ("rosalia-demo", "--install")):
        with pytest.raises(SystemExit) as exc:
            main(["train", recipe, "--help"])
        assert exc.value.code == 0
        assert flag in capsys.readouterr().out  # the recipe's own options, parsed by `xflow train`


def test_every_parser_lives_in_commands():
    """No module outside commands/ (and cli.py) builds an argparse parser, except the demo recipe's,
    which `xflow train demo` registers (owned with the recipe by training/), and two `python -m`
    tools that are not `xflow` sub-commands (the LISA checkpoint converter, the CMC report scorer)."""
    import ast

    import monailabel_xflow

    root = Path(monailabel_xflow.__file__).parent
    builders = set()
    for path in package_files(root=root):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "ArgumentParser":
                builders.add(rel)
    outside = {b for b in builders if not b.startswith("commands/") and b != "cli.py"}
    assert outside == {"training/demo.py", "rosalia/checkpoint.py", "ils/report_eval.py"}
