"""How a ``%%train`` cell runs as a train job: a folder of files and a fresh Python process.

The kernel writes a per-job folder under its working directory (``.gpushare/cells/<id>/``):
``cell.py`` (the code), ``with.pkl`` (the ``--with`` variables) and ``spec.json`` (which
``--out`` variables to bring back). The job runs, in that working directory and with the
kernel's own Python::

    python -u -m jupyter_gpushare.notebook.runner FOLDER

and writes ``out.pkl`` (the ``--out`` values) and ``result.json`` (what could not be sent back);
in a distributed job, every rank runs the cell and rank 0 alone writes them.
Files are the channel because the job sees the notebook's files wherever it runs (on
Kubernetes the notebook's volumes are mounted in the job's pod); no token or socket is needed.

This module is both sides of that format and imports only the standard library, so a job
starts fast.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
import secrets
import sys
import traceback
import types

CELLS = os.path.join(".gpushare", "cells")
CELL, WITH, SPEC, OUT, RESULT = "cell.py", "with.pkl", "spec.json", "out.pkl", "result.json"
EXIT_INPUT = 2  # a --with value could not be loaded in the job
EXIT_OUTPUT = 3  # an --out value is missing or cannot be pickled


class PackError(ValueError):
    """A ``--with`` value that cannot be sent; the message is one sentence."""


# -- the kernel's side ---------------------------------------------------------------------

def pack(workdir: str, source: str, with_vars: dict | None = None,
         out: list[str] | tuple = ()) -> str:
    """Write a cell's folder under ``workdir``; return its absolute path.

    Each ``--with`` value is pickled on its own so that a bad one is named; the folder is
    private to the user (mode 0700) since the job runs as the same account."""
    blobs = {}
    for name, value in (with_vars or {}).items():
        try:
            blobs[name] = pickle.dumps(value)
        except Exception as e:  # pickling raises all sorts (TypeError, PicklingError, ...)
            raise PackError(f"--with {name}: cannot be sent to the job, it cannot be pickled "
                            f"({type(e).__name__}: {_first_line(e)})") from None
    folder = os.path.join(os.path.abspath(workdir), CELLS, secrets.token_hex(6))
    os.makedirs(folder, mode=0o700)
    with open(os.path.join(folder, CELL), "w", encoding="utf-8") as f:
        f.write(source)
    with open(os.path.join(folder, WITH), "wb") as f:
        pickle.dump(blobs, f)
    with open(os.path.join(folder, SPEC), "w") as f:
        json.dump({"out": list(out)}, f)
    return folder


def command(folder: str) -> list[str]:
    """The job's command: this kernel's Python, unbuffered so that lines stream."""
    return [sys.executable, "-u", "-m", __name__, folder]


def unpack(folder: str) -> tuple[dict, list[str]]:
    """After the job: the ``--out`` values it sent back, and sentences about those it could
    not. Values that fail to load here (a class the notebook does not have) are problems too."""
    problems = []
    try:
        with open(os.path.join(folder, RESULT)) as f:
            problems = list(json.load(f).get("problems", []))
        with open(os.path.join(folder, OUT), "rb") as f:
            blobs = pickle.load(f)
    except FileNotFoundError:
        return {}, problems or ["the job wrote no --out values (it did not reach the end of "
                                "the cell)"]
    values = {}
    for name, blob in blobs.items():
        try:
            values[name] = pickle.loads(blob)
        except Exception as e:
            problems.append(f"--out {name}: cannot be loaded in the notebook "
                            f"({type(e).__name__}: {_first_line(e)})")
    return values, problems


# -- the job's side ------------------------------------------------------------------------

def run(folder: str) -> int:
    """Run the cell in a fresh ``__main__`` with the ``--with`` variables; return the exit
    status. The user's own errors print their traceback (it is their job's log), without
    this module's frames."""
    with open(os.path.join(folder, SPEC)) as f:
        out = json.load(f)["out"]
    path = os.path.join(folder, CELL)
    with open(path, encoding="utf-8") as f:
        source = f.read()
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main  # classes defined in the cell pickle as __main__.X
    namespace = main.__dict__
    with open(os.path.join(folder, WITH), "rb") as f:
        blobs = pickle.load(f)
    for name, blob in blobs.items():
        try:
            namespace[name] = pickle.loads(blob)
        except Exception as e:
            print(f"gpushare: --with {name} cannot be loaded in the job ({type(e).__name__}: "
                  f"{_first_line(e)}); functions and classes defined in the notebook travel "
                  f"by name only, so define them in the cell or in a module", file=sys.stderr)
            return EXIT_INPUT
    try:
        code = compile(source, path, "exec")
        exec(code, namespace)
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__.tb_next if e.__traceback__ else None  # drop run()'s frame
        traceback.print_exception(type(e), e, tb)
        return 1
    sys.stdout.flush()
    if os.environ.get("RANK", "0") != "0":
        return 0  # a distributed cell's --out values come from rank 0 alone
    return send_back(folder, namespace, out)


def send_back(folder: str, namespace: dict, names: list[str]) -> int:
    blobs, problems = {}, []
    for name in names:
        if name not in namespace:
            problems.append(f"--out {name}: the cell did not define {name}")
            continue
        try:
            blobs[name] = pickle.dumps(namespace[name])
        except Exception as e:
            problems.append(f"--out {name}: cannot be pickled ({type(e).__name__}: "
                            f"{_first_line(e)})")
    _write(os.path.join(folder, OUT), pickle.dumps(blobs))
    _write(os.path.join(folder, RESULT), json.dumps({"problems": problems}).encode())
    for problem in problems:
        print(f"gpushare: {problem}", file=sys.stderr)
    return EXIT_OUTPUT if problems else 0


def _write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _first_line(error) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no details"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m jupyter_gpushare.notebook.runner FOLDER")
    sys.exit(run(sys.argv[1]))
