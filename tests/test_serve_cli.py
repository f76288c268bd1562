"""``xflow serve``'s checks before anything starts, and its stopping, without MONAI Label.

A bad ``--port``, ``--conf`` value or ``--studies`` is one line on stderr and exit status 2, in a
dry run too, before the workspace is written; a good dry run prints the command. The launcher
(:func:`~monailabel_xflow.commands.serve.run_server`) is run on a stand-in server that starts a
child of its own, as MONAI Label starts its scoring subprocess: whether the server exits on its
own or is stopped by a SIGTERM to the launcher, the child is ended after it. The real server
stopped while it scores: ``test_app_tasks.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from monailabel_xflow.cli import main


def serve(tmp_path: Path, *args: str) -> list[str]:
    """``xflow serve --workspace tmp/ws --studies tmp/studies ARGS --dry-run`` as argv."""
    studies = tmp_path / "studies"
    studies.mkdir(exist_ok=True)
    return ["serve", "--workspace", str(tmp_path / "ws"), "--studies", str(studies), *args, "--dry-run"]


def refused(tmp_path: Path, capsys, argv: list[str]) -> str:
    """Run ``argv``; assert it is refused (exit 2, one line on stderr, nothing on stdout, no
    workspace written) and return the line."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert not (tmp_path / "ws").exists()  # refused before anything is written
    return err.strip()


@pytest.mark.parametrize("port", ["70000", "99999", "65536", "-1", "0"])
def test_a_port_out_of_range_is_one_line(tmp_path, capsys, port):
    line = refused(tmp_path, capsys, serve(tmp_path, "--port", port))
    assert line == f"xflow serve: --port must be 1..65535, got {port}"


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("prefetch", "nope", "--conf prefetch must be true or false, got 'nope'"),
        ("body_timeout_s", "0", "--conf body_timeout_s must be an integer 1..3600, got 0"),
        ("max_sessions", "many", "--conf max_sessions must be an integer 1..10000"),
        ("request_threads", "65", "--conf request_threads must be an integer 1..64"),
        ("store_seg", "maybe", "--conf store_seg must be true or false"),
        ("store_mb", "-1", "--conf store_mb must be an integer 0..4194304"),
        ("allow_unsupported_monailabel", "ok", "--conf allow_unsupported_monailabel must be true or false"),
        ("encode_precision", "fp8", "--conf encode_precision 'fp8' is not one of"),
        ("click_refinement", "magic", "--conf click_refinement 'magic' is not one of"),
        ("dicomweb_search_filter", "{Modality", "--conf dicomweb_search_filter is not JSON"),
        ("dicomweb_search_filter", '["CR"]', "--conf dicomweb_search_filter must be a JSON object"),
    ],
)
def test_a_bad_conf_value_is_one_line_naming_the_key(tmp_path, capsys, key, value, says):
    line = refused(tmp_path, capsys, serve(tmp_path, "--conf", key, value))
    assert line.startswith(f"xflow serve: {says}"), line


def test_the_last_value_of_a_repeated_conf_key_is_the_one_checked(tmp_path, capsys):
    """As MONAI Label builds the app's conf: the last value wins."""
    line = refused(tmp_path, capsys, serve(tmp_path, "--conf", "prefetch", "false", "--conf", "prefetch", "nope"))
    assert line.startswith("xflow serve: --conf prefetch must be true or false")
    assert main(serve(tmp_path, "--conf", "prefetch", "nope", "--conf", "prefetch", "false")) == 0


def test_studies_that_are_a_file_or_missing_are_named_so(tmp_path, capsys):
    file = tmp_path / "image.png"
    file.write_bytes(b"")
    argv = ["serve", "--workspace", str(tmp_path / "ws"), "--dry-run", "--studies"]
    assert refused(tmp_path, capsys, [*argv, str(file)]) == f"xflow serve: studies {file} is not a folder"
    missing = tmp_path / "nope"
    assert refused(tmp_path, capsys, [*argv, str(missing)]) == f"xflow serve: studies folder {missing} does not exist"


def test_a_good_dry_run_prints_the_command(tmp_path, capsys):
    """Ports at both ends of the range, good values and a key the app does not read (MONAI Label
    hands any key to the app, so it is passed on with a warning, not refused)."""
    argv = serve(tmp_path, "--port", "65535", "--conf", "prefetch", "false", "--conf", "body_timeout_s", "3600")
    assert main([*argv, "--conf", "dicomweb_search_filter", '{"Modality": "CR"}', "--conf", "not_read", "1"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and err.splitlines() == [
        "xflow serve: warning: --conf not_read is not a key this app reads, so it has no effect; keys: docs/app.md"
    ]
    assert "--port 65535" in out and "--conf prefetch false --conf body_timeout_s 3600" in out
    assert "--conf not_read 1" in out
    assert main(serve(tmp_path, "--port", "1")) == 0 and capsys.readouterr().out.endswith(" --port 1\n")


def test_the_conf_help_points_to_the_documentation(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "docs/app.md" in help_text


# --- stopping: a stand-in server with a child of its own -------------------------------------

STAND_IN_SERVER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(sys.argv[1] + ".part", "w") as f:
    f.write(str(child.pid))
os.rename(sys.argv[1] + ".part", sys.argv[1])
if sys.argv[2] == "exit":
    while not os.path.exists(sys.argv[1] + ".go"):
        time.sleep(0.05)
    sys.exit(3)
time.sleep(300)
"""
"""Starts a child that would run for 5 minutes, writes its id to ``argv[1]``, then exits with
status 3 once ``argv[1].go`` exists (``argv[2] == "exit"``) or waits to be stopped (SIGTERM's
default: it dies at once)."""

LAUNCHER = """
import sys
from monailabel_xflow.commands import serve
if sys.argv[1] == "no-adoption":  # what other systems than Linux do: the SIGTERM's snapshot only
    serve.adopt_orphans = lambda: False
sys.exit(serve.run_server(sys.argv[2:]))
"""


def launch(tmp_path: Path, mode: str, adoption: str) -> tuple[subprocess.Popen, psutil.Process]:
    """Start :func:`run_server` on the stand-in server; return the launcher and the server's child."""
    pid_file = tmp_path / "child.pid"
    server = [sys.executable, "-c", STAND_IN_SERVER, str(pid_file), mode]
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, adoption, *server], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert launcher.poll() is None and time.monotonic() < deadline, "the stand-in server never started its child"
        time.sleep(0.05)
    return launcher, psutil.Process(int(pid_file.read_text()))


def ended(proc: psutil.Process, timeout: float) -> bool:
    """Whether ``proc`` ends (or is a zombie: ended, not yet reaped by init) within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def stop(launcher: subprocess.Popen, child: psutil.Process) -> None:
    """Kill what a failed test left running (the launcher, the stand-in server, its child), by id."""
    left = [child]
    if launcher.poll() is None:
        with contextlib.suppress(psutil.NoSuchProcess):
            left += psutil.Process(launcher.pid).children(recursive=True)
        launcher.kill()
        launcher.communicate()
    for proc in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.status() != psutil.STATUS_ZOMBIE:
                proc.kill()


@pytest.mark.parametrize("adoption", ["adoption", "no-adoption"])
def test_sigterm_to_the_launcher_ends_the_server_and_what_it_started(tmp_path, adoption):
    if adoption == "adoption" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_CHILD_SUBREAPER is Linux's")
    launcher, child = launch(tmp_path, "wait", adoption)
    try:
        os.kill(launcher.pid, signal.SIGTERM)  # the launcher only: it passes it on to the server
        _, err = launcher.communicate(timeout=20)
        assert launcher.returncode == 0  # stopped as asked (the stand-in died of the SIGTERM)
        assert ended(child, 5), "the server's child outlived the stopped launcher"
        assert f"xflow serve: ended 1 process(es) the server had started: {child.pid}" in err
    finally:
        stop(launcher, child)


def test_a_server_that_exits_on_its_own_leaves_no_child_running(tmp_path):
    """E.g. a port taken: uvicorn exits after the app's start-up, which started the scoring."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the orphans of a server that was not stopped are found on Linux only")
    launcher, child = launch(tmp_path, "exit", "adoption")
    try:
        (tmp_path / "child.pid.go").touch()
        _, err = launcher.communicate(timeout=20)
        assert launcher.returncode == 3  # the server's exit status
        assert ended(child, 5), "the child of the server that exited is still running"
        assert f"xflow serve: ended 1 process(es) the server had started: {child.pid}" in err
    finally:
        stop(launcher, child)
