"""The demo's notebook environment (``hub_config/demo_env.py``) against another account on
the same machine, as it would try: making the environment's folder itself while root builds
it, or a missing folder on the way before root makes it; root must never run a program from
a folder another account owns.

``bob`` is the attacker and acts as himself (``runuser``), so the tests need root. The build
is the real one up to the commands it runs: ``Root`` records them, answers the venv, wheel and
pip steps without running them (no network, a second rather than minutes) and lets bob act
where the venv would be made."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hubtest import system_users

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hub_config"))
import demo_env  # noqa: E402
from demo_env import DemoEnvError  # noqa: E402


def as_bob(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "bob", "--", *argv], capture_output=True)


def others_on_the_way(path: Path) -> list[Path]:
    """The folders on the way to ``path`` that an account other than root owns."""
    return [p for p in Path(path).parents if p.exists() and p.stat().st_uid != 0]


class Root:
    """The commands the build runs as root: recorded, with the folders on each one's way
    that another account owned when it ran; the build's own steps answered, the rest (the
    probes of the system's Python) run."""

    def __init__(self, before_venv=lambda env: None):
        self.before_venv = before_venv
        self.ran, self.from_others = [], []
        self._run = subprocess.run

    def run(self, argv, **kwargs):
        argv = [str(a) for a in argv]
        self.ran.append(argv)
        if others_on_the_way(argv[0]):
            self.from_others.append((argv, others_on_the_way(argv[0])))
        done = subprocess.CompletedProcess(argv, 0, "", "")
        if argv[1:3] == ["-m", "venv"]:
            env = Path(argv[3])
            self.before_venv(env)
            (env / "bin").mkdir(parents=True, exist_ok=True)  # as venv would, into any folder
            (env / "bin" / "python").symlink_to(argv[0])
        elif argv[1:4] == ["-m", "pip", "wheel"]:
            folder = Path(argv[argv.index("--wheel-dir") + 1])
            (folder / "jupyter_gpushare-0-py3-none-any.whl").write_bytes(b"")
        elif argv[1:4] == ["-m", "pip", "install"]:
            pass
        elif "jupyter_gpushare.spawner" in argv[-1]:
            done.stdout = f"{argv[0]}-site\n{Path(argv[0]).parent}\n"
        else:
            return self._run(argv, **kwargs)
        return done


@pytest.fixture
def top(monkeypatch):
    """A folder of root's that every account can enter, with ``sticky/`` (1777, like /tmp)."""
    system_users(["bob"])
    if shutil.which("runuser") is None:
        pytest.skip("runuser is needed to act as bob")
    try:
        demo_env.base_python()
    except DemoEnvError as exc:
        pytest.skip(str(exc))
    top = Path(tempfile.mkdtemp(prefix="gpushare-demo-env-"))
    try:
        top.chmod(0o755)
        (top / "sticky").mkdir()
        (top / "sticky").chmod(0o1777)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def build(env: Path, root: Root, monkeypatch) -> str | None:
    """Build the environment at ``env``; the refusal's sentence, or None when built."""
    monkeypatch.setattr(demo_env, "subprocess", root)
    try:
        demo_env.ensure(env, REPO)
    except DemoEnvError as exc:
        return str(exc)
    finally:
        monkeypatch.undo()
    return None


def test_bob_making_the_folder_during_the_build_in_a_sticky_folder_gets_nothing_run(
        top, monkeypatch):
    """GPUSHARE_DEMO_ENV=/tmp/demo-env: between root's check and the venv, bob makes the
    folder with a bin/ of his own, where root would then run python -m pip."""
    env = top / "sticky" / "demo-env"
    root = Root(before_venv=lambda env: as_bob("mkdir", "-p", str(env / "bin")))
    refused = build(env, root, monkeypatch)
    assert not root.from_others, f"root ran programs from bob's folders: {root.from_others}"
    assert refused and f"other accounts may write in {top / 'sticky'}" in refused
    assert "GPUSHARE_DEMO_ENV" in refused


def test_bob_making_a_missing_folder_on_the_way_first_gets_nothing_run(top, monkeypatch):
    """GPUSHARE_DEMO_ENV=/tmp/gpushare/demo-env where /tmp/gpushare is missing: bob makes it
    just before root does."""
    env = top / "sticky" / "gpushare" / "demo-env"
    mkdir = os.mkdir

    def bob_first(path, *args, **kwargs):
        if Path(path) == env.parent:
            as_bob("mkdir", "-m", "777", str(path))
        return mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", bob_first)
    root = Root()
    refused = build(env, root, monkeypatch)
    assert not root.from_others, f"root ran programs from bob's folders: {root.from_others}"
    assert refused and f"{env.parent} belongs to another account" in refused


def test_an_environment_in_a_folder_of_roots_under_a_sticky_one_is_built(top, monkeypatch):
    """The layout the demo's own test uses (a folder of root's in /tmp), with a missing
    folder on the way made by root."""
    env = top / "sticky" / "mine" / "made" / "demo-env"
    (top / "sticky" / "mine").mkdir(mode=0o755)
    root = Root()
    assert build(env, root, monkeypatch) is None
    python = str(env / "bin" / "python")
    assert [python, "-m", "pip", "install"] in [a[:4] for a in root.ran]
    assert not root.from_others
    for folder in (env.parent, env, env / "bin"):
        st = folder.stat()
        assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o755), folder
    assert (env / demo_env.STAMP).exists()


def test_each_clone_has_its_own_environment_by_default(tmp_path):
    """Two clones on one machine shared one environment, so each start reinstalled the other
    clone's code over it (a second start took 22 s): by default the environment is the
    checkout's own, beside the others, and the same clone always finds its own."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    assert demo_env.default_env(one) != demo_env.default_env(two)
    assert demo_env.default_env(one) == demo_env.default_env(tmp_path / "." / "one")
    assert demo_env.default_env(one).parent == demo_env.DEFAULT_ENV.parent
    assert demo_env.default_env(one).name.startswith("demo-env-")
