"""A ``shardfeed`` command sets how long Arrow's allocator keeps freed pages, before Arrow loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow  # noqa: F401  # loaded here first, as any process but a command has it

from shardfeed.cli import arrow_allocator
from shardfeed.cli.arrow_allocator import DELAY_MS, PURGE_DELAY, keep_freed_pages


def _command_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != PURGE_DELAY}


def test_the_command_sets_it_before_arrow_loads():
    probe = (
        "import sys, os\n"
        "import shardfeed.cli.main\n"
        "assert 'pyarrow' in sys.modules\n"
        f"print(os.environ.get({PURGE_DELAY!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env=_command_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(DELAY_MS)


def test_the_users_own_setting_stays():
    probe = f"import os, shardfeed.cli.main; print(os.environ[{PURGE_DELAY!r}])"
    env = {**_command_env(), PURGE_DELAY: "10"}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "10"


def test_nothing_is_set_once_arrow_is_loaded(monkeypatch):
    environ: dict[str, str] = {}
    assert "pyarrow" in sys.modules  # this test process loaded it long ago
    assert keep_freed_pages(environ) is False and environ == {}
    monkeypatch.setattr(arrow_allocator.sys, "modules", {})
    assert keep_freed_pages(environ) is True and environ == {PURGE_DELAY: str(DELAY_MS)}
