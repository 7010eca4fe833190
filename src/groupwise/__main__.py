"""``python -m groupwise``: the command line (:func:`groupwise.cli.main`).

A Ctrl-C before anything was saved exits with the shell's 130 at once (``os._exit``), skipping
the interpreter's finalisation: when the interrupt lands in code that an extension runs through
CPython's ``PyRun_*`` while it is imported, CPython re-sends itself SIGINT at exit, and the
shell would see a death by signal instead of 130. Nothing written needs finalising by then."""

import os
import sys


def _exit_interrupted() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


try:
    from . import cli
except KeyboardInterrupt:  # Ctrl-C while the command line itself is imported
    print("groupwise: interrupted (nothing saved)", file=sys.stderr)
    _exit_interrupted()

code = cli.main()
if cli.INTERRUPTED:
    _exit_interrupted()
raise SystemExit(code)
