"""What every ``gpushare`` command shares: its argument parser, its errors (one line on
stderr and an exit status, never a traceback) and how it prints for people."""

from __future__ import annotations

import argparse
import sys

from .text import visible


def say(text: str, file=None, flush: bool = False) -> None:
    """Print ``text`` for people (stdout unless ``file``). Names, reasons and the service's
    sentences are other people's words: what a terminal would obey in them (an escape
    sequence, a right-to-left override) is printed as an escape instead
    (:func:`~.text.visible`); the lines stay lines. JSON for scripts is printed as it is
    (``json.dumps`` escapes all but ASCII), and so is a job's own output (``gpushare logs``:
    only its owner, or an admin, reads it)."""
    print(visible(text, lines=True), file=file or sys.stdout, flush=flush)


def write_csv(text: str) -> None:
    """CSV as it is into a file or a pipe; escaped as ``say`` does onto a terminal, its rows
    one a line."""
    if sys.stdout.isatty():
        text = visible(text.replace("\r\n", "\n"), lines=True)
    sys.stdout.write(text)


class _Parser(argparse.ArgumentParser):
    """Bad arguments get one sentence and exit status 2, never a usage dump or a traceback."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message}; see '{self.prog} --help'\n")


class CommandError(Exception):
    """A failure said in one line on stderr; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


class UsageError(CommandError):
    """Input the user can fix; printed as one line, exit status 2."""

    def __init__(self, message: str):
        super().__init__(message, 2)
