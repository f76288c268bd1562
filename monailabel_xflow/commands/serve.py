"""``xflow serve``: start the MONAI Label server with the XFlow app.

Usage::

    xflow serve --studies PATH_OR_DICOMWEB_URL [--workspace DIR | --app DIR] [--host 127.0.0.1]
                [--port 8000] [--models CONFIG] [--conf KEY VALUE]... [--dry-run]

The app is in the package (:class:`monailabel_xflow.app.xflow_app.XFlowApp`). MONAI Label serves
an app *folder* and writes into it (``logs/``, ``model/``, ``lib/``, ``bin/``), so the server is
given a **workspace** folder outside the package: ``--workspace DIR``, else ``$XFLOW_WORKSPACE``,
else ``$XDG_DATA_HOME/monailabel-xflow/workspace`` (``~/.local/share/monailabel-xflow/workspace``).
:func:`prepare_workspace` creates it with a one-line ``main.py`` that imports the packaged app
(MONAI Label loads ``main.py``) and refuses a folder whose ``main.py`` is something else. The
workspace then holds the server's log (``logs/app.log``), trained segmenters (``model/``, unless
``--conf model_dir``) and, unless the variables are set, MONAI Label's DICOMweb cache and
sessions (``cache/``). ``--app DIR`` serves another MONAI Label app folder instead (upstream's
behaviour: it writes into that folder).

Runs ``python -m monailabel.main start_server --app WORKSPACE --studies STUDIES --host H --port P
--conf K V ...`` with this interpreter (not the ``monailabel`` shell launcher, which splits
arguments on spaces, runs whichever ``python`` is first on PATH and prepends a parent folder to
PYTHONPATH). It is the same server as upstream's own ``monailabel start_server --app apps/xflow``
from a checkout (the repository's ``apps/xflow/main.py`` imports the same class): the app sets
the MONAI Label settings it needs itself (:mod:`monailabel_xflow.app.server_defaults`: DICOMweb
cache expiry, cache and session folders in the app folder; variables already set win), and its
datastores default to CR/DX series and add ``*.dcm`` / ``*.jpeg`` files.

``--models CONFIG`` is ``--conf models_file CONFIG``. ``--conf`` keys the app reads: ``docs/app.md``
(:mod:`monailabel_xflow.app.xflow_app`); the values the app checks at start-up are checked first
(:func:`check_conf`), so a bad one is one line, not a server's traceback. The server keeps the
foreground; Ctrl-C (or SIGTERM to ``xflow serve``, passed on to the server) stops it, and what the
server started and left running (its scoring or training subprocess) is ended after it
(:func:`run_server`). ``--dry-run`` checks the arguments, prepares the workspace and prints the
command (which then starts the same server by hand). Exit status: the server's (0 when it was
stopped by Ctrl-C or SIGTERM); 2 when the port, a ``--conf`` value, the app folder, the workspace
or the studies folder is unusable.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from monailabel_xflow.commands import user_folder
from monailabel_xflow.errors import InputError

POINTER_IMPORT = "from monailabel_xflow.app.xflow_app import XFlowApp"
POINTER_MARK = "(written by `xflow serve`)"
WORKSPACE_MAIN = (
    f'"""XFlow workspace for MONAI Label {POINTER_MARK}: the app is in the installed package."""\n'
    f"{POINTER_IMPORT}  # noqa: F401\n"
)
"""The ``main.py`` of a workspace: MONAI Label finds :class:`XFlowApp` in it."""


PORTS = (1, 65535)
"""The ports ``--port`` may name. Not 0 (uvicorn's "any free port"): MONAI Label calls its own server
back on the port it was given (``settings.MONAI_LABEL_SERVER_PORT``, batch infer), and the address
``xflow serve`` prints would be wrong."""

STOP_GRACE_S = 10.0
"""Seconds what the stopped server left running has after SIGTERM before it is killed."""


class WorkspaceError(InputError):
    """A workspace folder that cannot be used (exit status 2)."""


class ConfError(InputError):
    """A ``--conf`` value the app would refuse (exit status 2): :func:`check_conf`."""


def default_workspace(environ: Mapping[str, str] | None = None) -> Path:
    """``$XFLOW_WORKSPACE``, else ``$XDG_DATA_HOME/monailabel-xflow/workspace`` (XDG's default
    ``~/.local/share``): a per-user folder, never inside the installed package."""
    return user_folder("workspace", "XFLOW_WORKSPACE", environ)


def prepare_workspace(folder: str | os.PathLike) -> Path:
    """Create ``folder`` (absolute) with the :data:`WORKSPACE_MAIN` pointer; returns it.

    A pointer of another version is rewritten; a folder whose own ``main.py`` serves the packaged
    app (the repository's ``apps/xflow/``) is used as it is, its ``main.py`` never rewritten.

    Raises:
        WorkspaceError: ``folder`` is a file, is inside the package or site-packages, or holds a
            ``main.py`` that is not the pointer (another app: serve it with ``--app``).
    """
    import sysconfig

    import monailabel_xflow

    folder = Path(folder).expanduser().resolve()
    installed = {
        Path(monailabel_xflow.__file__).resolve().parent,
        *(Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")),
    }
    for place in installed:
        if folder == place or place in folder.parents:
            raise WorkspaceError(
                f"workspace {folder} is inside {place}, where Python packages live; "
                "choose a folder of your own (--workspace DIR)"
            )
    if folder.exists() and not folder.is_dir():
        raise WorkspaceError(f"workspace {folder} is not a folder")
    main = folder / "main.py"
    current = main.read_text() if main.is_file() else None
    if current is not None and POINTER_IMPORT not in current:
        raise WorkspaceError(
            f"{main} is not XFlow's workspace pointer (serve that app with --app {folder}, "
            "or choose another --workspace)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    if current is None or (POINTER_MARK in current and current != WORKSPACE_MAIN):  # new, or another version's
        main.write_text(WORKSPACE_MAIN)
    return folder


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="start the MONAI Label server with the XFlow app",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--workspace",
        help="folder for the server's logs, trained models and caches (default "
        "$XFLOW_WORKSPACE, else ~/.local/share/monailabel-xflow/workspace)",
    )
    where.add_argument("--app", help="serve this MONAI Label app folder instead of the packaged app")
    parser.add_argument(
        "--studies", required=True, help="studies folder, or a DICOMweb URL (http://host:port/dicom-web)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--models", help="model configuration file (same as --conf models_file PATH)")
    parser.add_argument(
        "--conf",
        nargs=2,
        action="append",
        default=[],
        metavar=("KEY", "VALUE"),
        help="app configuration, repeatable (e.g. --conf prefetch false); the keys and their values: "
        "docs/app.md in the monailabel-xflow repository",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="check the arguments, prepare the workspace, print the command"
    )
    parser.set_defaults(func=run)


def server_command(
    app: str, studies: str, host: str, port: int, conf: Sequence[Sequence[str]] = (), python: str | None = None
) -> list[str]:
    """The ``python -m monailabel.main start_server ...`` argument list."""
    cmd = [
        python or sys.executable,
        "-m",
        "monailabel.main",
        "start_server",
        "--app",
        str(app),
        "--studies",
        str(studies),
        "--host",
        host,
        "--port",
        str(int(port)),
    ]
    for key, value in conf:
        cmd += ["--conf", str(key), str(value)]
    return cmd


def check_conf(conf: Mapping[str, str]) -> None:
    """Refuse a ``--conf`` value the app would not start or serve with, without starting anything.

    With the app's own checks where it has a function for them:
    :func:`~monailabel_xflow.serving.limits.server_limits` (``body_timeout_s``, ``max_sessions``,
    ``request_threads``; ``XFLOW_MAX_BODY_MB`` too),
    :func:`~monailabel_xflow.app.requests.store_seg_default` and
    :meth:`~monailabel_xflow.workflow.model_config.ModelConfig.with_overrides` (``encode_precision``,
    ``click_refinement``: a bad one leaves the server without models), and the readers the app
    calls while it starts things (``prefetch``, ``store_mb``, ``allow_unsupported_monailabel``,
    ``dicomweb_search_filter``: a JSON object). Other keys are
    not checked: paths are used as they are, and MONAI Label hands any key to the app, so an
    unknown one is not an error.

    Raises:
        ConfError: a bad value; the message names the key.
    """
    from monailabel_xflow.app.requests import dicomweb_filter_conf, prefetch_enabled, store_seg_default
    from monailabel_xflow.app.wraps import conf_override
    from monailabel_xflow.segmenter.store import store_mb
    from monailabel_xflow.serving.limits import server_limits
    from monailabel_xflow.workflow.model_config import SERVER_OVERRIDES, ModelConfig, ModelConfigError

    try:
        server_limits(conf)  # body_timeout_s, max_sessions, request_threads: what the guard refuses
        # the app's own readers of the keys it reads in code that starts things
        store_seg_default(conf)
        prefetch_enabled(conf)
        store_mb(conf)
        conf_override(conf)
        dicomweb_filter_conf(conf)
    except InputError as exc:
        raise ConfError(str(exc)) from exc
    for key in SERVER_OVERRIDES:  # the runtime's overrides of the models file
        if conf.get(key):
            try:
                ModelConfig().with_overrides(**{key: conf[key]})
            except ModelConfigError as exc:
                raise ConfError(f"--conf {exc}" if str(exc).startswith(key) else f"--conf {key}: {exc}") from exc


def end_processes(procs: Iterable[Any], grace: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM to each of ``procs`` (:class:`psutil.Process`) still running, SIGKILL to those left
    ``grace`` seconds later. A process id since reused by another process is left alone (psutil
    checks). Returns the ids of the processes that were running."""
    import psutil

    running = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):  # ended meanwhile, or not ours to signal
            if proc.status() != psutil.STATUS_ZOMBIE:  # a zombie has ended, only not been reaped
                proc.terminate()
                running.append(proc)
    _, left = psutil.wait_procs(running, timeout=grace)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(left, timeout=5)
    return [proc.pid for proc in running]


def adopt_orphans() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux ``PR_SET_CHILD_SUBREAPER``):
    a process the server started and left running when it exited, whatever the reason, is then
    this process's child, not init's, and :func:`run_server` finds it. Returns whether it is set."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)) == 0  # 36: PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def run_server(cmd: Sequence[str]) -> int:
    """Run the server in the foreground until it exits; then end what it started and left running.

    MONAI Label's scoring and training subprocesses outlive a server stopped by SIGTERM (nothing in
    the server stops them) and keep writing into the studies folder and the workspace. So the
    processes under the server are recorded when a SIGTERM arrives (before the server exits: its
    orphans are out of reach afterwards) and, on Linux, orphans come to this process
    (:func:`adopt_orphans`); once the server has exited (having shut down cleanly), those still
    running get SIGTERM, then SIGKILL after :data:`STOP_GRACE_S` seconds.

    A SIGTERM to this process alone (``kill PID``, a service manager) is passed on to the server,
    or it would outlive its launcher and keep the port; Ctrl-C reaches the whole process group,
    the server included, and is not passed on (uvicorn would take a second SIGINT for "exit now").

    Returns:
        The server's exit status; 0 after Ctrl-C, and after a SIGTERM the server obeyed.
    """
    import psutil

    adopted = adopt_orphans()
    left: set[psutil.Process] = set()

    def descendants(pid: int) -> list[psutil.Process]:
        try:
            return psutil.Process(pid).children(recursive=True)
        except psutil.Error:  # gone
            return []

    server = subprocess.Popen(list(cmd))

    stopped = []  # a SIGTERM was passed on: the server's end was asked for

    def forward(signum: int, _frame: object) -> None:
        if server.poll() is None:  # once the server is reaped its id may be another process's
            left.update(descendants(server.pid))  # now, while they are still the server's
            stopped.append(signum)
            server.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    try:
        status = server.wait()
        if stopped and status in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
            status = 0  # stopped as asked, like Ctrl-C: a service manager's `stop` is no failure
    except KeyboardInterrupt:
        left.update(descendants(server.pid))
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C is uvicorn's "exit now": keep waiting
        server.wait()  # the server got the same Ctrl-C: let it finish shutting down
        status = 0
    if adopted:
        left.update(descendants(os.getpid()))
    ended = end_processes(list(left))
    if ended:
        print(
            f"xflow serve: ended {len(ended)} process(es) the server had started: {', '.join(map(str, ended))}",
            file=sys.stderr,
        )
    return status


def run(args: argparse.Namespace) -> int:
    """``xflow serve``: check the arguments (one line and exit status 2 for a bad one, before
    anything is written or started), prepare the workspace, then print or run the server command.

    Returns:
        The exit status (:func:`run_server`'s when the server ran).
    """
    lo, hi = PORTS
    if not lo <= args.port <= hi:
        print(f"xflow serve: --port must be {lo}..{hi}, got {args.port}", file=sys.stderr)
        return 2
    studies = str(args.studies)
    if not studies.startswith(("http://", "https://")):
        if not Path(studies).exists():
            print(f"xflow serve: studies folder {studies} does not exist", file=sys.stderr)
            return 2
        if not Path(studies).is_dir():
            print(f"xflow serve: studies {studies} is not a folder", file=sys.stderr)
            return 2
    conf = [tuple(c) for c in args.conf]
    if args.models:
        conf = [c for c in conf if c[0] != "models_file"] + [("models_file", str(Path(args.models).resolve()))]
    try:
        check_conf(dict(conf))  # as MONAI Label reads them: the last value of a key repeated
    except ConfError as exc:
        print(f"xflow serve: {exc}", file=sys.stderr)
        return 2
    from monailabel_xflow.serving.conf_keys import unknown_conf_keys

    for line in unknown_conf_keys(key for key, _ in conf):
        print(f"xflow serve: warning: {line}", file=sys.stderr)
    if args.app:
        app = Path(args.app)
        if not (app / "main.py").is_file():
            print(f"xflow serve: {app} is not a MONAI Label app folder (no main.py)", file=sys.stderr)
            return 2
    else:
        try:
            app = prepare_workspace(args.workspace or default_workspace())
        except (WorkspaceError, OSError) as exc:
            print(f"xflow serve: {exc}", file=sys.stderr)
            return 2
    cmd = server_command(str(app), studies, args.host, args.port, conf)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    print(
        f"xflow serve: http://{args.host}:{args.port}/ (studies {studies}; {'app' if args.app else 'workspace'} {app})",
        file=sys.stderr,
    )
    return run_server(cmd)
