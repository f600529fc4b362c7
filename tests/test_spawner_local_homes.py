"""The local spawner's homes against another account on the same machine, as it would try:
a home made first with start-up files in it, and a symbolic link swapped in right after the
hub makes a home in a parent others may write.

``bob`` is the attacker and acts as himself (``runuser``), so the tests need root. The
spawner is the real one, stopped where it would start the server (``HomeOnlySpawner``)."""

import asyncio
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from hubtest import system_users
from jupyter_gpushare.spawner import LocalGPUShareSpawner
from jupyter_gpushare.spawner.base import GPUShareSpawnerBase


class ServerWouldStart(Exception):
    pass


class _StopBeforeTheServer(GPUShareSpawnerBase):
    async def start(self):
        raise ServerWouldStart


class HomeOnlySpawner(LocalGPUShareSpawner, _StopBeforeTheServer):
    """The real spawner's start up to its parent's start: the home is made and checked, no
    slice is reserved and no server started."""


def start(user: str, **config) -> None:
    """Start ``user``'s server; returns when the home is ready, raises the refusal if not."""
    spawner = HomeOnlySpawner(user=SimpleNamespace(name=user), **config)
    with pytest.raises(ServerWouldStart):
        asyncio.run(spawner.start())


def as_bob(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "bob", "--", *argv], check=True)


@pytest.fixture
def top():
    """A folder every account can enter, with ``open/`` (0777, not sticky: anyone may add,
    remove or rename in it) and ``sticky/`` (1777, like /tmp)."""
    system_users(["alice", "bob"])
    top = Path(tempfile.mkdtemp(prefix="gpushare-homes-"))
    try:
        top.chmod(0o755)
        for name, mode in (("open", 0o777), ("sticky", 0o1777)):
            (top / name).mkdir()
            (top / name).chmod(mode)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def plant_home(home: Path) -> None:
    """bob makes ``home`` first, with an IPython start-up file that would run as its user."""
    as_bob("mkdir", "-p", str(home / ".ipython/profile_default/startup"))
    as_bob("sh", "-c", f"echo 'print(\"bob was here\")' > "
                       f"{home}/.ipython/profile_default/startup/00-bob.py")
    as_bob("chmod", "-R", "a+rwX", str(home))


def test_a_home_planted_for_the_hub_user_is_refused(top):
    """run_as_hub_user with homes in a /tmp-like folder: bob makes alice's home first."""
    home = top / "sticky" / "alice"
    plant_home(home)
    with pytest.raises(Exception, match=r"is not a folder of the hub's user's own.*"
                                        r"hub_user_home_template"):
        start("alice", run_as_hub_user=True, hub_user_home_template=f"{top}/sticky/{{username}}")


def test_a_home_planted_for_a_user_is_refused(top):
    home = top / "sticky" / "alice"
    plant_home(home)
    with pytest.raises(Exception, match=r"is not a folder of alice's own.*user_home_template"):
        start("alice", user_home_template=f"{top}/sticky/{{username}}")


def test_a_home_in_a_parent_others_may_change_is_refused(top):
    """In a parent anyone may write that is not sticky, another account could swap a home
    while its server runs."""
    with pytest.raises(Exception, match=r"open \(where .*/open/bob is\) may be changed by "
                                        r"other accounts.*user_home_template"):
        start("bob", user_home_template=f"{top}/open/{{username}}")
    assert not (top / "open" / "bob").exists()


def test_a_link_swapped_in_after_the_mkdir_gives_nothing_away(top, monkeypatch):
    """bob's home is made in a folder of his own (allowed: he could do anything there
    anyway); right after the hub's mkdir he replaces it with a link to a file of root's. The
    hub must not give him that file."""
    victim = top / "root-file"
    victim.write_text("root's\n")
    bobs = top / "bobs"
    bobs.mkdir()
    os.chown(bobs, pwd.getpwnam("bob").pw_uid, pwd.getpwnam("bob").pw_gid)
    home = bobs / "bob"
    mkdir = os.mkdir

    def mkdir_then_bob_swaps(path, *args, **kwargs):
        mkdir(path, *args, **kwargs)
        if os.path.basename(path) == "bob":
            as_bob("sh", "-c", f"rmdir {home} && ln -s {victim} {home}")

    monkeypatch.setattr(os, "mkdir", mkdir_then_bob_swaps)
    with pytest.raises(Exception, match="is not a folder of bob's own"):
        start("bob", user_home_template=f"{top}/bobs/{{username}}")
    assert victim.stat().st_uid == 0, "the hub gave bob root's file through his link"


def test_a_missing_home_is_made_for_its_user_and_an_existing_one_of_theirs_is_kept(top):
    start("alice", user_home_template=f"{top}/sticky/{{username}}")
    made = (top / "sticky" / "alice").stat()
    assert (made.st_uid, made.st_mode & 0o777) == (pwd.getpwnam("alice").pw_uid, 0o700)
    start("alice", user_home_template=f"{top}/sticky/{{username}}")  # hers: kept
    start("alice", run_as_hub_user=True,
          hub_user_home_template=f"{top}/hub/homes/{{username}}")  # parents made
    made = (top / "hub" / "homes" / "alice").stat()
    assert (made.st_uid, made.st_mode & 0o777) == (os.geteuid(), 0o700)
