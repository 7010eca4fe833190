"""Checking a report in a real browser: :func:`check_in_browser` renders a page in headless
Chromium and lists what went wrong (used by ``scripts/check_report_browser.py`` and the
tests)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from .html import REPORT_TITLE

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=5000",
)

# Chromium writes each console message of the page to stderr as
#   [pid:tid:date/time:INFO:CONSOLE:3] "Uncaught ReferenceError: f is not defined", source: ... (3)
# (Chromium 150; older versions wrote CONSOLE(3)). The level of console.error/warn/log is not in
# the line, so every console message counts: the report itself never writes to the console.
_CONSOLE = re.compile(r":CONSOLE(?::(\d+)\]|\((\d+)\)\])\s*(.*)")


def console_messages(stderr: str) -> list[str]:
    """The page's console messages (and any uncaught exception) from Chromium's stderr log."""
    found = []
    for line in stderr.splitlines():
        match = _CONSOLE.search(line)
        if match:
            found.append(match.group(3).strip())
        elif "Uncaught" in line:
            found.append(line.strip())
    return found


def dom_problems(dom: str, title: str = REPORT_TITLE) -> list[str]:
    """What is wrong with a report's DOM as dumped after the load event."""
    problems = []
    if title not in dom:
        problems.append(f"the page did not render: {title!r} is not in the DOM")
    body = re.search(r"<body\b[^>]*>", dom, re.IGNORECASE)
    attrs = dict(re.findall(r'(data-[\w-]+)="([^"]*)"', body.group(0))) if body else {}
    images = len(re.findall(r"<img\b", dom, re.IGNORECASE))
    if "data-images-ok" not in attrs:
        problems.append("the page's load script did not run (no data-images-ok on <body>)")
        return problems
    loaded = attrs.get("data-images-loaded", "")
    if attrs["data-images-ok"] != "true":
        problems.append(f"images failed to load: {loaded} of {images} <img> loaded")
    elif loaded != str(images):
        problems.append(f"data-images-loaded={loaded} but the page has {images} <img> tags")
    errors = attrs.get("data-page-errors", "0")
    if errors != "0":
        problems.append(f"{errors} error event(s) on the page (script errors or failed loads)")
    return problems


def check_in_browser(
    path: str | Path, chromium: str = "chromium", timeout: float = 60.0
) -> list[str]:
    """Open ``path`` in headless Chromium; the problems found (empty: it rendered, every image
    loaded, and nothing was written to the console)."""
    path = Path(path).resolve()
    if not path.is_file():
        return [f"{path}: no such file"]
    exe = shutil.which(chromium)
    if exe is None:
        return [f"{chromium!r} not found on PATH (Debian: apt-get install chromium)"]
    with tempfile.TemporaryDirectory(prefix="groupwise-chromium-") as profile:
        command = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", path.as_uri()]
        # Own process group, so a timeout can end the browser's helper processes too.
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        try:
            dom, log = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return [
                f"chromium did not finish within {timeout:.0f} s (an alert() or other dialog "
                "blocks headless Chromium)"
            ]
    problems = []
    if proc.returncode != 0:
        problems.append(f"chromium exited with status {proc.returncode}")
    problems += [f"console: {message}" for message in console_messages(log)]
    problems += dom_problems(dom)
    return problems
