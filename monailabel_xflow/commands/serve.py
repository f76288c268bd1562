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

``--models CONFIG`` is ``--conf models_file CONFIG``. ``--conf`` keys the app reads:
:mod:`monailabel_xflow.app.xflow_app`. The server keeps the foreground; Ctrl-C stops it.
``--dry-run`` prepares the workspace and prints the command (which then starts the same server by
hand). Exit status: the server's; 2 when the app folder, the workspace or the studies folder is
unusable.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from monailabel_xflow.commands import user_folder
from monailabel_xflow.errors import InputError

POINTER_IMPORT = "from monailabel_xflow.app.xflow_app import XFlowApp"
POINTER_MARK = "(written by `xflow serve`)"
WORKSPACE_MAIN = (
    f'"""XFlow workspace for MONAI Label {POINTER_MARK}: the app is in the installed package."""\n'
    f"{POINTER_IMPORT}  # noqa: F401\n"
)
"""The ``main.py`` of a workspace: MONAI Label finds :class:`XFlowApp` in it."""


class WorkspaceError(InputError):
    """A workspace folder that cannot be used (exit status 2)."""


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
        help="app configuration, repeatable (models_file, model_dir, dicomweb_search_filter, store_seg)",
    )
    parser.add_argument("--dry-run", action="store_true", help="prepare the workspace, print the command")
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


def run(args: argparse.Namespace) -> int:
    studies = str(args.studies)
    if not studies.startswith(("http://", "https://")) and not Path(studies).is_dir():
        print(f"xflow serve: studies folder {studies} does not exist", file=sys.stderr)
        return 2
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
    conf = [tuple(c) for c in args.conf]
    if args.models:
        conf = [c for c in conf if c[0] != "models_file"] + [("models_file", str(Path(args.models).resolve()))]
    cmd = server_command(str(app), studies, args.host, args.port, conf)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    print(
        f"xflow serve: http://{args.host}:{args.port}/ (studies {studies}; {'app' if args.app else 'workspace'} {app})",
        file=sys.stderr,
    )
    server = subprocess.Popen(cmd)
    # A SIGTERM aimed at this process alone (`kill PID`, a service manager) must reach the server,
    # or it would outlive its launcher and keep the port; Ctrl-C already reaches the whole group.
    signal.signal(signal.SIGTERM, lambda signum, _frame: server.send_signal(signum))
    try:
        return server.wait()
    except KeyboardInterrupt:
        server.wait()  # the server got the same Ctrl-C: let it finish shutting down
        return 0
