"""Which browser the page tests drive: ``SHARDWISE_CHROMIUM`` first (a Chromium or Chrome of the user's, for a
machine where Debian's package cannot be installed without root), then Debian's Chromium on the PATH."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from ui_support import find_chromium


def test_a_browser_named_by_the_environment_is_taken_first(tmp_path: Path) -> None:
    browser = tmp_path / "chrome"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(browser.stat().st_mode | stat.S_IXUSR)
    assert find_chromium({"SHARDWISE_CHROMIUM": str(browser), "PATH": ""}) == str(browser)


def test_a_named_browser_that_cannot_run_is_none_not_another(tmp_path: Path) -> None:
    assert find_chromium({"SHARDWISE_CHROMIUM": str(tmp_path / "missing")}) is None
    plain = tmp_path / "not-executable"
    plain.write_text("")
    assert find_chromium({"SHARDWISE_CHROMIUM": str(plain)}) is None


def test_without_the_variable_debians_chromium_on_the_path() -> None:
    assert find_chromium({}) == (
        shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    )
