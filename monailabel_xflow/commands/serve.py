"""``xflow serve``: start the MONAI Label server with the XFlow app.

Usage::

    xflow serve [--app apps/xflow] --studies PATH_OR_DICOMWEB_URL [--host 127.0.0.1] [--port 8000]
                [--models CONFIG] [--conf KEY VALUE]... [--dry-run]

Runs ``python -m monailabel.main start_server --app APP --studies STUDIES --host H --port P
--conf K V ...`` with this interpreter (not the ``monailabel`` shell launcher, which splits JSON
arguments on spaces and prepends a parent folder to PYTHONPATH) and an environment
that suits radiographs:

* ``MONAI_LABEL_DICOMWEB_SEARCH_FILTER={"Modality":"CR,DX"}`` (the PACS' CR/DX series are the
  images; upstream lists CT; ``{}`` would list SEG label series as images);
* ``MONAI_LABEL_DICOMWEB_CACHE_EXPIRY=10`` (seconds; upstream's 7200 hides new series and
  labels for two hours);
* ``MONAI_LABEL_DATASTORE_FILE_EXT`` adds ``*.dcm`` and ``*.jpeg`` to the folder extensions.

Variables already set in the environment win. ``--models CONFIG`` is ``--conf models CONFIG``.
``--conf`` keys the app reads: ``models``, ``model_dir``, ``dicomweb_search_filter`` (JSON).
The server keeps the foreground; Ctrl-C stops it. Exit status: the server's; 2 when the app
folder or the studies folder does not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

DEFAULT_APP = "apps/xflow"

SERVER_ENV: dict[str, str] = {
    "MONAI_LABEL_DICOMWEB_SEARCH_FILTER": json.dumps({"Modality": "CR,DX"}),
    "MONAI_LABEL_DICOMWEB_CACHE_EXPIRY": "10",
    "MONAI_LABEL_DATASTORE_FILE_EXT": json.dumps(
        ["*.nii.gz", "*.nii", "*.nrrd", "*.png", "*.jpg", "*.jpeg", "*.dcm"]),
}
"""Environment defaults for a radiograph server (an existing variable wins)."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="start the MONAI Label server with the XFlow app",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--app", default=DEFAULT_APP, help=f"app folder (default {DEFAULT_APP})")
    parser.add_argument("--studies", required=True, help="studies folder, or a DICOMweb URL (http://host:port/dicom-web)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--models", help="model configuration file (same as --conf models PATH)")
    parser.add_argument("--conf", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                        help="app configuration, repeatable (models, model_dir, dicomweb_search_filter, store_seg)")
    parser.add_argument("--dry-run", action="store_true", help="print the command and environment, start nothing")
    parser.set_defaults(func=run)


def server_command(app: str, studies: str, host: str, port: int, conf: Sequence[Sequence[str]] = (),
                   python: str | None = None) -> list[str]:
    """The ``python -m monailabel.main start_server ...`` argument list."""
    cmd = [python or sys.executable, "-m", "monailabel.main", "start_server", "--app", str(app),
           "--studies", str(studies), "--host", host, "--port", str(int(port))]
    for key, value in conf:
        cmd += ["--conf", str(key), str(value)]
    return cmd


def server_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with :data:`SERVER_ENV` filled in where unset."""
    env = dict(os.environ if base is None else base)
    for key, value in SERVER_ENV.items():
        env.setdefault(key, value)
    return env


def run(args: argparse.Namespace) -> int:
    app = Path(args.app)
    if not (app / "main.py").is_file():
        print(f"xflow serve: {app} is not a MONAI Label app folder (no main.py)", file=sys.stderr)
        return 2
    studies = str(args.studies)
    if not studies.startswith(("http://", "https://")) and not Path(studies).is_dir():
        print(f"xflow serve: studies folder {studies} does not exist", file=sys.stderr)
        return 2
    conf = [tuple(c) for c in args.conf]
    if args.models:
        conf = [c for c in conf if c[0] != "models"] + [("models", str(Path(args.models).resolve()))]
    cmd = server_command(str(app), studies, args.host, args.port, conf)
    env = server_env()
    if args.dry_run:
        for key in SERVER_ENV:
            print(f"{key}={env[key]}")
        print(" ".join(cmd))
        return 0
    print(f"xflow serve: http://{args.host}:{args.port}/ (studies {studies})", file=sys.stderr)
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0
