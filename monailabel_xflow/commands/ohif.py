"""``xflow ohif``: serve the current OHIF viewer with the PACS behind one origin, on loopback.

Usage::

    xflow ohif --install [--dir DIR]                        # once, by `make ohif` (the project's set-up)
    xflow ohif --studies http://HOST:PORT/dicom-web [--host 127.0.0.1] [--port 3000] [--dir DIR]
               [--seg-encoding labelmap|bitmap]

``--install`` fetches the pinned OHIF release (:data:`OHIF_PACKAGE` :data:`OHIF_VERSION`) with
``npm pack`` (npm's own client, the registry's tarball), checks it against the pinned
:data:`OHIF_INTEGRITY` (sha512, as ``npm view @ohif/app@3.13.2 dist.integrity`` prints it) and
unpacks its built viewer (``package/dist/``, about 200 MB) into ``DIR/<version>/dist``. We unpack
the package's ``dist`` rather than ``npm install`` it: the package's ``dependencies`` are the
sources the viewer was built from (the registry lacks some of them, e.g. ``@ohif/i18n@3.13.2``),
and the viewer needs none of them.

Serving never fetches anything. One origin (``http://HOST:PORT``) answers:

* ``/app-config.js``: OHIF's configuration, one DICOMweb data source at this origin's
  ``/dicom-web`` (:func:`app_config`); the packaged ``app-config.js`` (a public demo server) is
  never served;
* ``/dicom-web/...``: a small reverse proxy to ``--studies`` (QIDO, WADO, and STOW so that OHIF
  can store a segmentation), so the browser talks to one origin and the PACS needs no CORS;
  URLs the PACS writes into its JSON answers (bulk data) are rewritten to this origin; only
  GET/HEAD, and POST to ``/studies[/UID]`` (STOW), are forwarded; paths with ``..`` are refused;
* everything else: the viewer's files from ``dist``, with ``index.html`` for the viewer's own
  routes (``/viewer?StudyInstanceUIDs=...``, ``/segmentation?...``).

It binds 127.0.0.1 by default (put a TLS proxy in front to share it). The annotator opens
``http://127.0.0.1:3000/`` and sees the PACS's studies. Exit status 0 after Ctrl-C; 2 for bad
arguments, a missing viewer (run ``make ohif``) or a failed install.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import urllib.parse
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from monailabel_xflow.commands import checkout_root, user_folder

OHIF_PACKAGE = "@ohif/app"
OHIF_VERSION = "3.13.2"
OHIF_INTEGRITY = "sha512-WZdxmpmG7rqFgW9ZJLcbgr3XCtLi1KDNPoMaeY5PPe6j4G4fjEjjkycZM6C6Zk2F87BKxFfpq+jd5xXZB9E8EA=="
"""The registry's ``dist.integrity`` of ``@ohif/app@3.13.2``: the tarball must hash to it."""
PROXY_PREFIX = "/dicom-web"
DEFAULT_PORT = 3000
CHUNK = 1 << 16


def default_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``--install`` puts the viewer and serving looks for it: ``$XFLOW_OHIF_DIR``, else, when
    the package runs from a source checkout, the checkout's git-ignored ``.ohif/`` (where ``make
    ohif`` installs it, whatever the current folder), else ``$XDG_DATA_HOME/monailabel-xflow/ohif``
    (``~/.local/share/...``): a per-user folder, never inside the installed package."""
    env = os.environ if environ is None else environ
    checkout = checkout_root()
    if not env.get("XFLOW_OHIF_DIR") and checkout is not None:
        return checkout / ".ohif"
    return user_folder("ohif", "XFLOW_OHIF_DIR", env)


def dist_dir(root: Path | None = None) -> Path:
    """The pinned version's built viewer: ``ROOT/<OHIF_VERSION>/dist``."""
    return (root or default_dir()) / OHIF_VERSION / "dist"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "ohif",
        help=f"serve OHIF {OHIF_VERSION} with the PACS's DICOMweb behind one origin (loopback)",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--studies", help="the PACS's DICOMweb URL (http://host:port/dicom-web)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free)")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the viewer is installed (default: $XFLOW_OHIF_DIR, else the checkout's .ohif/ when run from "
        "a checkout, else ~/.local/share/monailabel-xflow/ohif)",
    )
    parser.add_argument(
        "--seg-encoding",
        choices=SEG_ENCODINGS,
        default="labelmap",
        help="how OHIF stores segmentations: labelmap (OHIF's default, Label Map SEG) or bitmap "
        "(binary SEG, for PACS/tools without the Label Map IOD)",
    )
    parser.add_argument(
        "--install",
        action="store_true",
        help=f"install {OHIF_PACKAGE}@{OHIF_VERSION} with npm (pinned, integrity-checked) and exit",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    root = args.dir or default_dir()
    if args.install:
        try:
            print(install(root))
        except (OSError, RuntimeError, tarfile.TarError) as exc:
            print(f"xflow ohif --install: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.studies or not args.studies.startswith(("http://", "https://")):
        print(f"xflow ohif: --studies must be a DICOMweb URL, got {args.studies!r}", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"xflow ohif: --port must be 0..65535, got {args.port}", file=sys.stderr)
        return 2
    dist = dist_dir(root)
    if not (dist / "index.html").is_file():
        print(
            f"xflow ohif: no OHIF {OHIF_VERSION} at {dist}; install it with `make ohif` (or `xflow ohif --install`)",
            file=sys.stderr,
        )
        return 2
    server = make_server(dist, args.studies, args.host, args.port, args.seg_encoding)
    print(
        f"OHIF {OHIF_VERSION} at http://{args.host}:{server.server_address[1]}/ "
        f"(DICOMweb: {args.studies} behind {PROXY_PREFIX})",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


# --- installing ---------------------------------------------------------------------------------


def install(root: Path) -> Path:
    """``npm pack`` the pinned release, check its integrity, unpack ``dist`` to ``ROOT/<version>/dist``.

    Idempotent: an existing ``dist/index.html`` is kept. Returns the dist folder.

    Raises:
        RuntimeError: npm is missing or failed, or the tarball does not hash to :data:`OHIF_INTEGRITY`.
    """
    dist = dist_dir(root)
    if (dist / "index.html").is_file():
        return dist
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed (node >= 18 and npm are needed once, to install the viewer)")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [npm, "pack", f"{OHIF_PACKAGE}@{OHIF_VERSION}", "--pack-destination", tmp, "--silent"],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        tarballs = sorted(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or len(tarballs) != 1:
            raise RuntimeError(f"npm pack {OHIF_PACKAGE}@{OHIF_VERSION} failed: {done.stderr.strip()[-2000:]}")
        digest = hashlib.sha512()
        with open(tarballs[0], "rb") as fh:
            for block in iter(lambda: fh.read(CHUNK), b""):
                digest.update(block)
        got = "sha512-" + base64.b64encode(digest.digest()).decode("ascii")
        if got != OHIF_INTEGRITY:
            raise RuntimeError(f"{tarballs[0].name}: integrity {got} is not the pinned {OHIF_INTEGRITY}")
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(tarballs[0]) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith("package/dist/")]
            tar.extractall(unpacked, members=members, filter="data")
        target = dist.parent
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        shutil.move(str(unpacked / "package" / "dist"), str(dist))  # may cross file systems
    (dist / "app-config.js").unlink(missing_ok=True)  # a public demo server's config: never served
    return dist


# --- serving ------------------------------------------------------------------------------------

SEG_ENCODINGS = ("labelmap", "bitmap")


def app_config(seg_encoding: str = "labelmap") -> str:
    """OHIF's ``window.config``: one DICOMweb data source at this origin's :data:`PROXY_PREFIX`.

    Args:
        seg_encoding: how OHIF stores a segmentation: ``labelmap`` (OHIF's default, the Label Map
            SEG IOD, RLE) or ``bitmap`` (the classic binary SEG, for PACS and tools that do not
            know the Label Map IOD yet).
    """
    if seg_encoding not in SEG_ENCODINGS:
        raise ValueError(f"seg_encoding must be one of {SEG_ENCODINGS}, got {seg_encoding!r}")
    source = {
        "namespace": "@ohif/extension-default.dataSourcesModule.dicomweb",
        "sourceName": "pacs",
        "configuration": {
            "friendlyName": "PACS (xflow ohif)",
            "name": "pacs",
            "qidoSupportsIncludeField": False,
            "imageRendering": "wadors",
            "thumbnailRendering": "wadors",
            "enableStudyLazyLoad": True,
            "supportsFuzzyMatching": False,
            "supportsWildcard": True,
            "omitQuotationForMultipartRequest": True,
            "bulkDataURI": {"enabled": False},
            "dicomUploadEnabled": False,
            "supportsReject": False,
            "segmentation": {"store": {"defaultMode": seg_encoding}},
        },
    }
    config = {
        "routerBasename": "/",
        "showStudyList": True,
        "extensions": [],
        "modes": [],
        "customizationService": {},
        "maxNumberOfWebWorkers": 2,
        "showWarningMessageForCrossOrigin": False,
        "showCPUFallbackMessage": False,
        "showLoadingIndicator": True,
        "strictZSpacingForVolumeViewport": True,
        "defaultDataSourceName": "pacs",
        "dataSources": [source],
    }
    return (
        "// written by `xflow ohif`: the PACS's DICOMweb behind this origin\n"
        f"window.config = {json.dumps(config, indent=1)};\n"
        "for (const key of ['qidoRoot', 'wadoRoot', 'wadoUriRoot'])\n"
        f"  window.config.dataSources[0].configuration[key] = window.location.origin + '{PROXY_PREFIX}';\n"
    )


def make_server(
    dist: Path, studies: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT, seg_encoding: str = "labelmap"
) -> ThreadingHTTPServer:
    """The viewer + proxy server, bound but not yet serving (``serve_forever`` it)."""
    upstream = urllib.parse.urlsplit(studies.rstrip("/"))
    handler = type(
        "OHIFHandler",
        (_Handler,),
        {"dist": dist.resolve(), "upstream": upstream, "config_js": app_config(seg_encoding).encode()},
    )
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve_in_thread(
    dist: Path, studies: str, host: str = "127.0.0.1", port: int = 0, seg_encoding: str = "labelmap"
) -> tuple[ThreadingHTTPServer, str]:
    """Start :func:`make_server` in a daemon thread; returns the server and its URL (tests, embedding)."""
    server = make_server(dist, studies, host, port, seg_encoding)
    threading.Thread(target=server.serve_forever, name="xflow-ohif", daemon=True).start()
    return server, f"http://{host}:{server.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    dist: Path
    upstream: urllib.parse.SplitResult
    config_js: bytes
    server_version = "xflow-ohif"

    def log_message(self, format: str, *args) -> None:  # noqa: A002  (the stdlib's signature)
        if os.environ.get("XFLOW_OHIF_ACCESS_LOG"):
            super().log_message(format, *args)

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch(send_body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch(send_body=False)

    def do_POST(self) -> None:  # noqa: N802
        path = urllib.parse.urlsplit(self.path).path
        rest = path[len(PROXY_PREFIX) :].strip("/").split("/")
        if path.startswith(PROXY_PREFIX + "/") and rest[0] == "studies" and len(rest) <= 2 and self._safe(path):
            self._proxy(send_body=True)
        else:
            self._error(405, "only STOW (POST /dicom-web/studies[/UID]) is forwarded")

    def _dispatch(self, send_body: bool) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if not self._safe(path):
            self._error(400, "path with '..' refused")
        elif path == PROXY_PREFIX or path.startswith(PROXY_PREFIX + "/"):
            self._proxy(send_body)
        elif path == "/app-config.js":
            self._send(200, "application/javascript", self.config_js, send_body)
        else:
            self._static(path, send_body)

    @staticmethod
    def _safe(path: str) -> bool:
        decoded = urllib.parse.unquote(path)
        return ".." not in decoded.split("/") and "\\" not in decoded and "\x00" not in decoded

    def _static(self, path: str, send_body: bool) -> None:
        rel = posixpath.normpath(urllib.parse.unquote(path)).lstrip("/")
        target = (self.dist / rel).resolve() if rel and rel != "." else self.dist / "index.html"
        if not target.is_relative_to(self.dist):
            return self._error(400, "outside the viewer")
        if not target.is_file():
            if "." in posixpath.basename(rel):  # a missing asset: 404, not the app
                return self._error(404, "not found")
            target = self.dist / "index.html"  # the viewer's own routes
        kind = _content_type(target)
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(target.stat().st_size))
        self.send_header("Cache-Control", "no-cache" if target.name == "index.html" else "max-age=3600")
        self.end_headers()
        if send_body:
            with open(target, "rb") as fh:
                shutil.copyfileobj(fh, self.wfile, CHUNK)

    def _proxy(self, send_body: bool) -> None:
        up = self.upstream
        split = urllib.parse.urlsplit(self.path)
        target = up.path + split.path[len(PROXY_PREFIX) :] + (f"?{split.query}" if split.query else "")
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0 or length > 1 << 30:
            return self._error(413, "request body over 1 GiB")
        body = self.rfile.read(length) if length else None
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() in ("accept", "content-type", "content-length", "authorization")
        }
        if not up.hostname:  # upstream URLs are checked at start; a hostless one never reaches here
            return self._error(502, "the upstream DICOMweb URL names no host")
        conn_type = http.client.HTTPSConnection if up.scheme == "https" else http.client.HTTPConnection
        conn = conn_type(up.hostname, up.port, timeout=300)
        try:
            conn.request(self.command, target, body=body, headers=headers)
            resp = conn.getresponse()
            kind = resp.getheader("Content-Type", "application/octet-stream")
            if "json" in kind:  # bulk-data URLs the PACS wrote: point them at this origin
                origin = f"http://{self.headers.get('Host', '')}{PROXY_PREFIX}"
                data = resp.read().replace(f"{up.scheme}://{up.netloc}{up.path}".encode(), origin.encode())
                return self._send(resp.status, kind, data, send_body)
            self.send_response(resp.status)
            for key in ("Content-Type", "Content-Length"):
                if value := resp.getheader(key):
                    self.send_header(key, value)
            if not resp.getheader("Content-Length"):
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if send_body:
                shutil.copyfileobj(resp, self.wfile, CHUNK)
        except OSError as exc:
            self._error(502, f"PACS at {up.netloc} unreachable: {exc}")
        finally:
            conn.close()

    def _send(self, status: int, kind: str, data: bytes, send_body: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if send_body:
            self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._send(status, "text/plain; charset=utf-8", f"{status}: {message}\n".encode(), True)


_TYPES = {
    ".js": "application/javascript",
    ".mjs": "application/javascript",
    ".css": "text/css",
    ".html": "text/html; charset=utf-8",
    ".json": "application/json",
    ".wasm": "application/wasm",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".woff2": "font/woff2",
    ".ico": "image/x-icon",
}


def _content_type(path: Path) -> str:
    return _TYPES.get(path.suffix.lower(), "application/octet-stream")
