"""How a ``%%train`` cell runs as a train job: a folder of files and a fresh Python process.

The kernel writes a per-job folder under its working directory (``.gpushare/cells/<id>/``):
``cell.py`` (the code), ``with.pkl`` (the ``--with`` variables) and ``spec.json`` (which
``--out`` variables to bring back). The job runs, in that working directory and with the
kernel's own Python::

    python -P -u -m jupyter_gpushare.notebook.runner FOLDER

and writes ``out.pkl`` (the ``--out`` values) and ``result.json`` (what could not be sent back);
in a distributed job, every rank runs the cell and rank 0 alone writes them.
Files are the channel because the job sees the notebook's files wherever it runs (on
Kubernetes the notebook's volumes are mounted in the job's pod); no token or socket is needed.

The folders may sit in a directory other users can write (a shared project folder), so both
sides trust a folder only when every level below the working directory (``.gpushare``,
``cells``, ``<id>``) is a real directory (no symlink) owned by the user and writable by
nobody else, and open each file by a descriptor of its folder with ``O_NOFOLLOW``: another
account cannot swap in a folder or a pickle of its own. The runner starts with the working
directory off ``sys.path`` (``-P``), so a module planted there cannot shadow the standard
library; the cell's own imports still find modules beside the notebook (the working
directory is appended to ``sys.path``, after the standard library and site-packages).

This module is both sides of that format and imports only the standard library, so a job
starts fast (and a test can run it as a file of its own).
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import pickle
import secrets
import stat
import sys
import traceback
import types

CELLS = os.path.join(".gpushare", "cells")
CELL, WITH, SPEC, OUT, RESULT = "cell.py", "with.pkl", "spec.json", "out.pkl", "result.json"
EXIT_INPUT = 2  # a --with value could not be loaded in the job (or its folder is not safe)
EXIT_OUTPUT = 3  # an --out value is missing or cannot be pickled
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The runner's command where the Python has no -P (3.10): drop the working directory from
# sys.path before anything is imported from it.
_BOOTSTRAP = ("import sys; del sys.path[0]; from jupyter_gpushare.notebook.runner import main; "
              "main()")


class PackError(ValueError):
    """A ``--with`` value that cannot be sent; the message is one sentence."""


class UnsafeFolder(OSError):
    """A folder of the channel that another account could change; one sentence."""

    def __str__(self):
        return self.args[0]


# -- both sides: folders only the user can change --------------------------------------------

def _trusted(fd: int, path: str, tighten: bool) -> None:
    """Refuse a folder or file not owned by this account, or a folder others may write in
    (where ``tighten``, a folder of ours is made private instead)."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise UnsafeFolder(f"{path} belongs to another account, so the job's files would not be "
                           f"safe there; remove it, or run from a directory of your own")
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022:
        if not tighten:
            raise UnsafeFolder(f"{path} may be changed by other accounts (mode "
                               f"{stat.S_IMODE(st.st_mode):o}), so the job's files are not safe "
                               f"there; make it private (chmod 700)")
        os.fchmod(fd, 0o700)


def _open_dir(name: str, path: str, dir_fd: int | None, tighten: bool = False) -> int:
    try:
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink, a file
            raise UnsafeFolder(f"{path} is not a plain directory (a symlink or a file), so the "
                               f"job's files would not be safe there; remove it") from None
        raise
    try:
        _trusted(fd, path, tighten)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_cells(workdir: str, create: bool) -> int:
    """A descriptor of ``workdir/.gpushare/cells``, each level checked (and made when
    ``create``)."""
    fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    path = workdir
    try:
        for name in CELLS.split(os.sep):
            path = os.path.join(path, name)
            if create:
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
            child = _open_dir(name, path, fd, tighten=create)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_folder(folder: str) -> int:
    """A descriptor of a cell's folder, every level below its working directory checked."""
    folder = os.path.abspath(folder)
    cells, name = os.path.split(folder)
    workdir = os.path.dirname(os.path.dirname(cells))
    if os.path.join(workdir, CELLS) != cells or not name:
        raise UnsafeFolder(f"{folder} is not a cell folder (.../{CELLS}/<id>)")
    parent = _open_cells(workdir, create=False)
    try:
        return _open_dir(name, folder, parent)
    finally:
        os.close(parent)


def _read(dir_fd: int, name: str, folder: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        _trusted(fd, os.path.join(folder, name), False)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def _write(dir_fd: int, name: str, data: bytes) -> None:
    """Atomically, by the folder's descriptor (a private folder: no one else makes names)."""
    tmp = f"{name}.tmp"
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


# -- the kernel's side ---------------------------------------------------------------------

def pack(workdir: str, source: str, with_vars: dict | None = None,
         out: list[str] | tuple = ()) -> str:
    """Write a cell's folder under ``workdir``; return its absolute path.

    Each ``--with`` value is pickled on its own so that a bad one is named. Every level of
    ``.gpushare/cells/<id>`` is made private to the user (mode 0700) and checked: raises
    :class:`UnsafeFolder` where another account owns one or could change it."""
    blobs = {}
    for name, value in (with_vars or {}).items():
        try:
            blobs[name] = pickle.dumps(value)
        except Exception as e:  # pickling raises all sorts (TypeError, PicklingError, ...)
            raise PackError(f"--with {name}: cannot be sent to the job, it cannot be pickled "
                            f"({type(e).__name__}: {_first_line(e)})") from None
    workdir = os.path.abspath(workdir)
    cells = _open_cells(workdir, create=True)
    try:
        while True:
            name = secrets.token_hex(6)
            try:
                os.mkdir(name, 0o700, dir_fd=cells)
                break
            except FileExistsError:
                continue
        folder = os.path.join(workdir, CELLS, name)
        fd = _open_dir(name, folder, cells, tighten=True)
    finally:
        os.close(cells)
    try:
        _write(fd, CELL, source.encode("utf-8"))
        _write(fd, WITH, pickle.dumps(blobs))
        _write(fd, SPEC, json.dumps({"out": list(out)}).encode())
    finally:
        os.close(fd)
    return folder


def command(folder: str) -> list[str]:
    """The job's command: this kernel's Python, unbuffered so that lines stream, without the
    working directory first on ``sys.path`` (``-P``; a bootstrap where there is no -P)."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-u", "-m", __name__, folder]
    return [sys.executable, "-u", "-c", _BOOTSTRAP, folder]


def unpack(folder: str) -> tuple[dict, list[str]]:
    """After the job: the ``--out`` values it sent back, and sentences about those it could
    not. Values that fail to load here (a class the notebook does not have) are problems too."""
    problems = []
    try:
        fd = _open_folder(folder)
    except UnsafeFolder as e:
        return {}, [str(e)]
    except FileNotFoundError:
        return {}, ["the job's folder is gone"]
    try:
        problems = list(json.loads(_read(fd, RESULT, folder)).get("problems", []))
        blobs = pickle.loads(_read(fd, OUT, folder))
    except FileNotFoundError:
        return {}, problems or ["the job wrote no --out values (it did not reach the end of "
                                "the cell)"]
    except UnsafeFolder as e:
        return {}, [str(e)]
    finally:
        os.close(fd)
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
    folder = os.path.abspath(folder)
    try:
        fd = _open_folder(folder)
    except FileNotFoundError:
        print(f"gpushare: the cell's folder {folder} is gone", file=sys.stderr)
        return EXIT_INPUT
    except UnsafeFolder as e:
        print(f"gpushare: {e}", file=sys.stderr)
        return EXIT_INPUT
    try:
        out = json.loads(_read(fd, SPEC, folder))["out"]
        source = _read(fd, CELL, folder).decode("utf-8")
        blobs = pickle.loads(_read(fd, WITH, folder))
    except UnsafeFolder as e:
        print(f"gpushare: {e}", file=sys.stderr)
        return EXIT_INPUT
    # Modules beside the notebook are found, after the standard library and site-packages.
    workdir = os.path.dirname(os.path.dirname(os.path.dirname(folder)))
    if workdir not in sys.path:
        sys.path.append(workdir)
    path = os.path.join(folder, CELL)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main  # classes defined in the cell pickle as __main__.X
    namespace = main.__dict__
    for name, blob in blobs.items():
        try:
            namespace[name] = pickle.loads(blob)
        except Exception as e:
            print(f"gpushare: --with {name} cannot be loaded in the job ({type(e).__name__}: "
                  f"{_first_line(e)}); functions and classes defined in the notebook travel "
                  f"by name only, so define them in the cell or in a module", file=sys.stderr)
            os.close(fd)
            return EXIT_INPUT
    try:
        code = compile(source, path, "exec")
        exec(code, namespace)
    except SystemExit:
        os.close(fd)
        raise
    except BaseException as e:
        os.close(fd)
        tb = e.__traceback__.tb_next if e.__traceback__ else None  # drop run()'s frame
        traceback.print_exception(type(e), e, tb)
        return 1
    sys.stdout.flush()
    try:
        if os.environ.get("RANK", "0") != "0":  # trainjob.RANK; this file stands alone
            return 0  # a distributed cell's --out values come from rank 0 alone
        return send_back(fd, namespace, out)
    finally:
        os.close(fd)


def send_back(dir_fd: int, namespace: dict, names: list[str]) -> int:
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
    _write(dir_fd, OUT, pickle.dumps(blobs))
    _write(dir_fd, RESULT, json.dumps({"problems": problems}).encode())
    for problem in problems:
        print(f"gpushare: {problem}", file=sys.stderr)
    return EXIT_OUTPUT if problems else 0


def _first_line(error) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no details"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -P -m jupyter_gpushare.notebook.runner FOLDER")
    sys.exit(run(sys.argv[1]))


if __name__ == "__main__":
    main()
