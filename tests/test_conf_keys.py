"""The app's ``--conf`` keys are one list, and a key it does not read is named, not ignored.

The list is checked against the package source: every ``conf.get("key")`` the package does is
listed, and every listed key is read somewhere, so the warning cannot drift from the code.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import monailabel_xflow
from monailabel_xflow.app.wraps import OVERRIDE_CONF
from monailabel_xflow.cli import main
from monailabel_xflow.serving.conf_keys import CONF_KEYS, UPSTREAM_CONF_KEYS, unknown_conf_keys
from monailabel_xflow.workflow.model_config import SERVER_OVERRIDES

PACKAGE = Path(monailabel_xflow.__file__).parent
# conf.get("key"), (conf or {}).get("key"), self._conf.get("key")
READ = re.compile(r"conf(?: or \{\}\))?\.get\(\s*\"(\w+)\"")


def package_sources() -> dict[Path, str]:
    return {p: p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "conf_keys.py"}


def test_every_key_the_package_reads_is_listed_and_every_listed_key_is_read():
    sources = package_sources()
    read = {key for text in sources.values() for key in READ.findall(text)}
    read |= {OVERRIDE_CONF, *SERVER_OVERRIDES}  # read through a constant
    assert read == CONF_KEYS
    assert len(read) >= 14  # the scan sees the readers (a broken pattern would find none)


def test_the_upstream_keys_are_those_monai_label_reads():
    import monailabel

    upstream = Path(monailabel.__file__).parent
    text = (upstream / "interfaces" / "app.py").read_text() + (upstream / "interfaces" / "config.py").read_text()
    assert set(READ.findall(text)) == set(UPSTREAM_CONF_KEYS)


@pytest.mark.parametrize(
    "key, nearest",
    [("prefech", "prefetch"), ("store_MB", "store_mb"), ("model_file", "models_file"), ("max_session", "max_sessions")],
)
def test_a_misspelt_key_is_named_with_the_nearest_one(key, nearest):
    (line,) = unknown_conf_keys([key, "prefetch", key])
    assert line.startswith(f"--conf {key} is not a key this app reads") and f"(did you mean {nearest}?)" in line


def test_known_keys_give_no_warning_and_a_foreign_key_no_guess():
    assert unknown_conf_keys(sorted(CONF_KEYS | UPSTREAM_CONF_KEYS)) == []
    (line,) = unknown_conf_keys(["zzz"])
    assert "did you mean" not in line and "docs/app.md" in line


def test_xflow_serve_warns_of_an_unknown_key_and_still_starts(tmp_path, capsys):
    studies = tmp_path / "studies"
    studies.mkdir()
    argv = ["serve", "--workspace", str(tmp_path / "ws"), "--studies", str(studies), "--dry-run"]
    assert main([*argv, "--conf", "prefech", "false", "--conf", "prefetch", "false"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "xflow serve: warning: --conf prefech is not a key this app reads, so it has no effect "
        "(did you mean prefetch?); keys: docs/app.md"
    ]
    assert "--conf prefech false" in out  # passed on: MONAI Label hands any key to the app
    assert main([*argv, "--conf", "store_mb", "0"]) == 0 and capsys.readouterr().err == ""
