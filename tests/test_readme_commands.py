"""Every command the READMEs show works word for word from a fresh clone (after ``make setup``).

The commands are taken from the ``bash`` code blocks of README.md and apps/xflow/README.md
(continuation lines joined, comments dropped, ``&&`` chains split), as a user would paste them
at the repository's root. Each is checked by its program:

* ``make T``: ``make -n T`` (the target exists and its recipe expands);
* ``xflow ...`` / ``.venv/bin/xflow ...``: parsed by ``xflow``'s own parser; those naming only
  what a clone holds are really run from a copy of the commands' folder (``xflow serve`` with
  ``--dry-run`` appended, its workspace in a temporary folder); those that need a PACS on port
  8042 or name a user's files (:data:`PLACEHOLDERS`) are parsed only;
* ``monailabel start_server ...``: parsed by MONAI Label's own parser; the app folder and the
  studies it names must exist, and it must bind loopback (``tests/test_upstream_app.py`` runs it);
* ``.venv/bin/python -c CODE``: compiled, and the sample image ids it names exist;
* ``. VENV/bin/activate``, ``pip``, ``python3.11 -m venv``, ``curl``: the files they name exist
  (or an earlier command of the block makes them), URLs are loopback.

A command of any other program fails the test until it is classified here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "apps/xflow/README.md"]
PLACEHOLDERS = {"/path/to/folder", "/data/cxr", "reports.csv", "stages.yaml", "models.yaml"}
"""Words that stand for the user's own files: a command holding one is parsed, not run."""
PACS = "http://127.0.0.1:8042/dicom-web"
"""The README's Orthanc (a PACS the user starts): commands that talk to it are parsed, not run."""


def blocks(doc: str) -> list[list[list[str]]]:
    """The ``bash`` blocks of ``doc``, each a list of simple commands (argument lists)."""
    text = (REPO / doc).read_text()
    out = []
    for match in re.finditer(r"^( *)```(?:bash|sh|shell)\n(.*?)^\1```", text, re.S | re.M):
        source = re.sub(r"\\\n\s*", "", match.group(2))  # continuation lines, as bash joins them
        commands = []
        for line in source.splitlines():
            words = shlex.split(line, comments=True)
            current: list[str] = []
            for word in [*words, "&&"]:
                if word in ("&&", ";", "||"):
                    if current:
                        commands.append(current)
                    current = []
                else:
                    current.append(word)
        out.append(commands)
    return out


ALL = [(doc, b, c) for doc in DOCS for b, block in enumerate(blocks(doc)) for c in range(len(block))]


def test_the_readmes_have_commands_to_check():
    programs = {blocks(doc)[b][c][0] for doc, b, c in ALL}
    assert {"make", ".venv/bin/xflow", "monailabel", ".venv/bin/python"} <= programs
    assert len(ALL) >= 20


def xflow_parse(argv: list[str]):
    from monailabel_xflow.cli import build_parser

    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:  # --version, --help
            return None
        raise AssertionError(f"xflow {' '.join(argv)}: not accepted by xflow's parser (exit {exc.code})") from exc


def run_xflow(argv: list[str], cwd: Path, tmp: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XFLOW_")}
    env["XFLOW_WORKSPACE"] = str(tmp / "workspace")  # the per-user default, kept in tmp
    return subprocess.run(
        [sys.executable, "-m", "monailabel_xflow.cli", *argv], cwd=cwd, env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> SimpleNamespace:
    """The folder the commands run in (what a clone holds that they read: sample-data/), and the
    commands already run there."""
    root = tmp_path_factory.mktemp("clone")
    shutil.copytree(REPO / "sample-data", root / "sample-data")
    return SimpleNamespace(root=root, tmp=tmp_path_factory.mktemp("clone-home"), done=set())


def check_xflow(argv: list[str], clone: SimpleNamespace, earlier: list[list[str]]) -> None:
    """Parse ``argv``; run it (after the block's earlier commands, once each) unless it needs
    the user's files or PACS."""
    xflow_parse(argv)
    if runnable(argv) and tuple(argv) not in clone.done:
        for before in earlier:  # e.g. `xflow phantom --out ph` before `xflow ils build --images ph`
            if (
                before[0] in ("xflow", ".venv/bin/xflow")
                and runnable(before[1:])
                and tuple(before[1:]) not in clone.done
            ):
                run_checked(before[1:], clone)
        run_checked(argv, clone)


def runnable(argv: list[str]) -> bool:
    return not (PLACEHOLDERS & set(argv) or any(a.startswith(PACS) for a in argv))


def run_checked(argv: list[str], clone: SimpleNamespace) -> None:
    clone.done.add(tuple(argv))
    cwd, tmp = clone.root, clone.tmp
    if argv == ["--version"]:
        assert run_xflow(argv, cwd, tmp).stdout.startswith("xflow ")
        return
    if argv[0] == "serve":
        argv = [*argv, "--dry-run"]
    done = run_xflow(argv, cwd, tmp)
    assert done.returncode == 0, f"xflow {' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    if argv[0] == "serve":
        command = shlex.split(done.stdout.strip().splitlines()[-1])
        assert command[1:4] == ["-m", "monailabel.main", "start_server"]
        assert command[command.index("--app") + 1] == str(tmp / "workspace")
        assert command[command.index("--host") + 1] == "127.0.0.1"


def check_monailabel(argv: list[str]) -> None:
    from monailabel.main import Main

    assert argv[0] == "start_server", argv
    try:
        args = Main().args_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"monailabel {' '.join(argv)}: not accepted by MONAI Label (exit {exc.code})") from exc
    assert "from monailabel_xflow.app.xflow_app import XFlowApp" in (REPO / args.app / "main.py").read_text()
    assert (REPO / args.studies).is_dir() and args.host == "127.0.0.1"


def check_python(argv: list[str]) -> None:
    assert argv[1] == "-c", argv
    compile(argv[2], "<README>", "exec")
    for image_id in re.findall(r"phantom_\d+_\d+", argv[2]):
        assert (REPO / "sample-data" / f"{image_id}.png").is_file(), image_id


@pytest.mark.parametrize("doc, block, index", ALL, ids=[f"{d}:{b}:{c}" for d, b, c in ALL])
def test_readme_command_works_from_a_fresh_clone(doc, block, index, clone):
    commands = blocks(doc)[block]
    argv = commands[index]
    program, args = argv[0], argv[1:]
    made = {Path(c[c.index("venv") + 1]) for c in commands[:index] if "venv" in c}  # python -m venv DIR
    if program == "make":
        assert len(args) == 1
        done = subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    elif program in ("xflow", ".venv/bin/xflow"):
        check_xflow(args, clone, commands[:index])
    elif program == "monailabel":
        check_monailabel(args)
    elif program == ".venv/bin/python":
        check_python(argv)
    elif program in (".", "source"):
        venv = Path(args[0]).parent.parent
        assert args[0].endswith("/bin/activate") and (venv == Path(".venv") or venv in made), argv
    elif program == "pip":
        if "-c" in args:
            assert (REPO / args[args.index("-c") + 1]).is_file()
        assert args[0] in ("install", "uninstall")
    elif program.startswith("python3"):
        assert args[:2] == ["-m", "venv"]
    elif program == "curl":
        url = next(a for a in args if a.startswith("http"))
        assert urlparse(url).hostname == "127.0.0.1"
    else:
        pytest.fail(f"{doc}: `{' '.join(argv)}`: a program this test does not know; add its check")
