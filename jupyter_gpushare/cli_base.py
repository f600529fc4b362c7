"""What every ``gpushare`` command shares: its argument parser and its errors (one line on
stderr and an exit status, never a traceback)."""

from __future__ import annotations

import argparse


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
