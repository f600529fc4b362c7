"""The ``%%train`` channel (``.gpushare/cells/<id>/``) against another account on the same
machine, as a hostile user would try it: a folder planted before, a folder swapped after, a
symlink, a pickle that runs code where it is loaded; and a module planted in the working
directory that would shadow the standard library in the runner.

The attacks use real accounts (``alice`` is the victim, ``bob`` the attacker), so they need
root; each side runs as its account in a process of its own, with ``runner.py`` (standard
library only) loaded from a folder every account can read."""

import os
import pickle
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hubtest import system_users

from jupyter_gpushare.notebook import runner

RUNNER = Path(runner.__file__)


class Evil:
    """Pickles to code that, where it is unpickled, leaves a file saying who ran it."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"import os; open({self.marker!r}, 'w').write(str(os.geteuid()))",))


@pytest.fixture
def shared():
    """A project folder every account may write in (mode 0777, no sticky bit), and a folder
    with a copy of runner.py that every account can read."""
    system_users(["alice", "bob"])
    top = Path(tempfile.mkdtemp(prefix="gpushare-shared-"))
    try:
        top.chmod(0o755)
        lib, project = top / "lib", top / "project"
        lib.mkdir(mode=0o755)
        project.mkdir()
        project.chmod(0o777)
        shutil.copy(RUNNER, lib / "runner.py")
        (lib / "runner.py").chmod(0o644)
        if users_python() is None:
            pytest.skip("no Python that the test accounts may run (they cannot run "
                        f"{sys.executable}, and there is no python3 in /usr/bin or /bin)")
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def users_python() -> str | None:
    """This Python where every account may run it, else the system's python3 (runner.py
    needs only the standard library)."""
    for python in (os.path.realpath(sys.executable), "/usr/bin/python3", "/bin/python3"):
        try:
            if subprocess.run([python, "-c", "import sys; assert sys.version_info >= (3, 10)"],
                              user="alice", capture_output=True).returncode == 0:
                return python
        except OSError:
            continue
    return None


def as_user(user: str, top: Path, code: str) -> subprocess.CompletedProcess:
    """Run Python ``code`` as ``user`` in the shared project folder, with ``runner``
    importable."""
    prelude = f"import sys; sys.path.insert(0, {str(top / 'lib')!r}); import runner\n"
    home = pwd.getpwnam(user).pw_dir
    return subprocess.run([users_python(), "-c", prelude + code],
                          user=user, group=pwd.getpwnam(user).pw_gid, extra_groups=[],
                          cwd=top / "project", env={"HOME": home, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)


def evil_cell(folder: Path, marker: str, owner: str) -> None:
    """bob's own cell folder at ``folder``: alice's spec, his pickle."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / runner.CELL).write_text("print('the cell ran')\n")
    (folder / runner.SPEC).write_text('{"out": ["x"]}')
    (folder / runner.WITH).write_bytes(pickle.dumps({"x": pickle.dumps(Evil(marker))}))
    (folder / runner.OUT).write_bytes(pickle.dumps({"x": pickle.dumps(Evil(marker))}))
    (folder / runner.RESULT).write_text('{"problems": []}')
    subprocess.run(["chown", "-R", f"{owner}:", str(folder.parents[1])], check=True)
    subprocess.run(["chmod", "-R", "a+rwX", str(folder.parents[1])], check=True)


def test_a_folder_planted_before_is_refused(shared):
    """bob makes .gpushare/cells first; alice's kernel must not put her cell in it (he could
    swap it for his own, whose pickle her job would load)."""
    marker = str(shared / "project" / "pwned")
    cells = shared / "project" / ".gpushare" / "cells"
    cells.mkdir(parents=True)
    subprocess.run(["chown", "-R", "bob:", str(cells.parent)], check=True)
    subprocess.run(["chmod", "-R", "0777", str(cells.parent)], check=True)
    packed = as_user("alice", shared, "print(runner.pack('.', 'x = 1', {'a': 1}, ['x']))")
    if packed.returncode == 0:  # not refused: play the rest of the attack
        folder = Path(packed.stdout.strip())
        subprocess.run(["mv", str(folder), str(folder) + ".alice"], check=True)
        evil_cell(folder, marker, "bob")
        as_user("alice", shared, f"runner.run({str(folder)!r})")
    assert not os.path.exists(marker), "bob's pickle ran as alice"
    assert packed.returncode != 0 and "belongs to another account" in packed.stderr, \
        packed.stderr


def test_a_folder_swapped_after_is_refused_by_the_job_and_the_kernel(shared):
    """alice's folders are private, but the project folder lets bob rename her .gpushare
    and build his own in its place."""
    marker = str(shared / "project" / "pwned")
    packed = as_user("alice", shared, "print(runner.pack('.', 'x = 1', {'a': 1}, ['x']))")
    assert packed.returncode == 0, packed.stderr
    folder = Path(packed.stdout.strip())
    mode = {p: os.stat(p).st_mode & 0o777 for p in (folder.parents[1], folder.parent, folder)}
    assert set(mode.values()) == {0o700}, mode
    project = shared / "project"
    os.rename(project / ".gpushare", project / ".gpushare-alice")  # what bob may do here
    evil_cell(folder, marker, "bob")
    ran = as_user("alice", shared, f"raise SystemExit(runner.run({str(folder)!r}))")
    assert not os.path.exists(marker), "bob's pickle ran in alice's job"
    assert ran.returncode == runner.EXIT_INPUT
    assert "belongs to another account" in ran.stderr and "the cell ran" not in ran.stdout
    unpacked = as_user("alice", shared, f"print(runner.unpack({str(folder)!r}))")
    assert not os.path.exists(marker), "bob's pickle ran in alice's kernel"
    assert "belongs to another account" in unpacked.stdout, unpacked.stdout + unpacked.stderr


def test_a_symlink_is_refused(shared):
    """bob points .gpushare at a folder of alice's that he knows (her home's own)."""
    project = shared / "project"
    target = shared / "alice-own"
    (target / "cells").mkdir(parents=True)
    subprocess.run(["chown", "-R", "alice:", str(target)], check=True)
    os.symlink(target, project / ".gpushare")
    packed = as_user("alice", shared, "print(runner.pack('.', 'x = 1'))")
    assert packed.returncode != 0 and "not a plain directory" in packed.stderr, packed.stderr
    assert not any((target / "cells").iterdir())


def test_a_folder_of_ours_that_others_may_write_is_made_private(tmp_path):
    """A .gpushare left group- and world-writable (an old umask) is tightened at the next
    pack; the job refuses a folder that others may still change."""
    (tmp_path / ".gpushare" / "cells").mkdir(parents=True)
    for p in (tmp_path / ".gpushare", tmp_path / ".gpushare" / "cells"):
        p.chmod(0o777)
    folder = Path(runner.pack(str(tmp_path), "x = 1"))
    assert all(os.stat(p).st_mode & 0o777 == 0o700
               for p in (folder.parents[1], folder.parent, folder))
    folder.parent.chmod(0o775)
    done = subprocess.run(runner.command(str(folder)), cwd=tmp_path, capture_output=True,
                          text=True)
    assert done.returncode == runner.EXIT_INPUT and "may be changed by other accounts" in \
        done.stderr


def test_a_module_planted_in_the_working_directory_does_not_shadow_the_standard_library(
        tmp_path):
    """Modules the runner and unpickling import (json, pickle, types, datetime...) come from
    the standard library even where the working directory holds files of those names; the
    cell still imports its own modules from beside the notebook."""
    marker = tmp_path / "shadowed"
    for name in ("json", "pickle", "types", "traceback", "datetime", "runpy", "secrets"):
        (tmp_path / f"{name}.py").write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\nraise ImportError('planted')\n")
    (tmp_path / "helpers.py").write_text("ANSWER = 42\n")
    import datetime
    folder = runner.pack(str(tmp_path), "import helpers\nb = (helpers.ANSWER, when.year)\n",
                         {"when": datetime.date(2026, 11, 24)}, ["b"])
    done = subprocess.run(runner.command(folder), cwd=tmp_path, capture_output=True, text=True)
    assert not marker.exists(), f"planted modules ran: {marker.read_text()}"
    assert done.returncode == 0, done.stderr
    assert runner.unpack(folder) == ({"b": (42, 2026)}, [])
