"""The demo's notebook environment: a Python that every demo account can run.

A root hub runs each notebook server and train job as its user. The README's set-up installs
the hub into ``.venv`` with whatever ``python3`` was at hand; where that Python lives in a
folder other accounts cannot enter (a pyenv under /root, mode 700, as on this project's
machines), alice could run neither her server nor her jobs. So the demo builds, once, an
environment from the system's Python in a folder all accounts can read, installs this
checkout into it as a wheel (the checkout may be unreadable to them too) and reuses it while
the checkout is unchanged:

    python3 -m venv ENV            (the system's python3, usable by every account)
    pip wheel --no-deps CHECKOUT   (with the hub's pip; the Lab extension is already built)
    ENV/bin/pip install WHEEL[demo]
    ENV/.gpushare-demo.json        (what was installed: a digest of the checkout's files)

Nothing here trusts a folder another account could write, since root runs ENV/bin/python:
every folder on the way to ENV must belong to root (or the account running the demo) and be
closed to other accounts. Only a folder above ENV's own parent may be sticky and open to all,
like /tmp: the sticky bit keeps others from moving or replacing the folder of root's beneath
it. ENV's parent may not, since the environment is removed and made again in it. Missing
folders are made (the environment itself without ``exist_ok``: one someone else made first
is not ours) and the whole way is checked again before anything in ENV runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_ENV = Path("/opt/jupyter-gpushare/demo-env")


def default_env(checkout: Path) -> Path:
    """The environment of this checkout by default: ``DEFAULT_ENV-<digest of its path>``. Two
    clones on one machine then each keep their own, and neither reinstalls the other's code
    over its own at every start (a second start reuses its environment in seconds)."""
    digest = hashlib.sha256(str(Path(os.path.realpath(checkout))).encode()).hexdigest()[:10]
    return DEFAULT_ENV.with_name(f"{DEFAULT_ENV.name}-{digest}")
STAMP = ".gpushare-demo.json"
BASE_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


class DemoEnvError(Exception):
    """The environment cannot be made; the message says what to do."""


def usable_by_others(path: Path) -> bool:
    """Whether an account other than the owner can reach ``path`` (every folder on the way
    searchable by others) and read it."""
    path = Path(os.path.realpath(path))
    try:
        for part in [*reversed(path.parents)]:
            if not part.stat().st_mode & stat.S_IXOTH:
                return False
        return bool(path.stat().st_mode & stat.S_IROTH)
    except OSError:
        return False


def python_usable_by_others(python: str) -> bool:
    """Whether other accounts can run this interpreter and import its standard library."""
    real = Path(os.path.realpath(python))
    if not (usable_by_others(real) and real.stat().st_mode & stat.S_IXOTH):
        return False
    found = subprocess.run([str(real), "-I", "-c", "import sys; print(sys.base_prefix)"],
                           capture_output=True, text=True, cwd="/")
    return found.returncode == 0 and usable_by_others(Path(found.stdout.strip()) / "lib")


def _check_safe(env: Path, *inside: str) -> None:
    """Refuse a place for the environment (or ``inside`` it) that another account could
    change: the hub runs pip there as root."""
    path = env.joinpath(*inside)
    for part in [*reversed(path.parents), path]:
        try:
            st = part.lstat()
        except FileNotFoundError:
            continue  # made by ensure(), then checked again
        if stat.S_ISLNK(st.st_mode):
            raise DemoEnvError(f"{part} is a symbolic link; give the demo environment a real "
                               f"folder with GPUSHARE_DEMO_ENV")
        if st.st_uid not in (0, os.geteuid()):
            raise DemoEnvError(f"{part} belongs to another account, so the demo will not "
                               f"install software there; choose a folder of root's own with "
                               f"GPUSHARE_DEMO_ENV")
        if not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            continue
        if part in env.parents[1:] and st.st_mode & stat.S_ISVTX:
            continue  # like /tmp: others cannot move the folder of root's beneath it
        raise DemoEnvError(f"other accounts may write in {part}, so one could put a folder "
                           f"of its own where the demo builds its environment; set "
                           f"GPUSHARE_DEMO_ENV to a folder inside one that only root may "
                           f"write (the default is {DEFAULT_ENV})")


def base_python() -> str:
    """The system's Python, which every account can run (with venv and ensurepip)."""
    wanted = os.environ.get("GPUSHARE_DEMO_PYTHON")
    for candidate in ([wanted] if wanted else BASE_PYTHONS):
        if not candidate or not os.path.exists(candidate):
            continue
        if not python_usable_by_others(candidate):
            continue
        probe = subprocess.run([candidate, "-I", "-c", "import sys, venv, ensurepip; "
                                "sys.exit(sys.version_info < (3, 10))"], capture_output=True,
                               cwd="/")
        if probe.returncode == 0:
            return candidate
    raise DemoEnvError(
        "no Python that all accounts can run was found (tried "
        + ", ".join([wanted] if wanted else BASE_PYTHONS) + "); install Debian's python3 and "
        "python3-venv (apt-get install python3-venv), or name one with GPUSHARE_DEMO_PYTHON")


def checkout_digest(checkout: Path) -> str:
    """What the environment must hold: the package's files as they are now (the built Lab
    extension included) and the project's metadata."""
    h = hashlib.sha256()
    files = [checkout / "pyproject.toml"]
    for top in ("jupyter_gpushare", "jupyter-config"):
        for root, dirs, names in os.walk(checkout / top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [Path(root) / n for n in sorted(names) if not n.endswith(".pyc")]
    for path in files:
        h.update(str(path.relative_to(checkout)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def _say(message: str) -> None:
    print(f"gpushare demo: {message}", file=sys.stderr, flush=True)


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, cwd="/")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise DemoEnvError(f"{what} failed: " + " / ".join(tail))


def ensure(env: Path, checkout: Path) -> dict:
    """The environment at ``env``, made or brought up to date; returns its stamp
    (``python``, ``bin``, ``site``, ``digest``)."""
    env = Path(os.path.abspath(env))
    _check_safe(env)
    for part in [*reversed(env.parents)]:
        try:
            os.mkdir(part, 0o755)
        except FileExistsError:
            pass  # judged by the check below, whoever made it
    _check_safe(env)
    old_umask = os.umask(0o022)  # what is installed must be readable by every account
    lock_path = env.parent / f".{env.name}.lock"
    try:
        try:
            lock = os.open(lock_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                           0o644)
        except OSError as exc:
            raise DemoEnvError(f"the lock {lock_path} cannot be opened ({exc.strerror}); "
                               f"remove it") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one hub builds at a time
            return _ensure_locked(env, checkout)
        finally:
            os.close(lock)
    finally:
        os.umask(old_umask)


def _ensure_locked(env: Path, checkout: Path) -> dict:
    digest = checkout_digest(checkout)
    stamp_path = env / STAMP
    try:
        stamp = json.loads(stamp_path.read_text())
    except (OSError, ValueError):
        stamp = {}
    python = env / "bin" / "python"
    if stamp.get("digest") == digest and python.exists():
        return stamp
    fresh = not python.exists()
    if fresh:
        base = base_python()
        _say(f"building the notebook environment that every demo account can run, in {env} "
             f"(once; a few minutes) from {base}")
        if env.exists():
            shutil.rmtree(env)
        os.mkdir(env, 0o755)  # no exist_ok: a folder someone made in between is not ours
        _run([base, "-m", "venv", str(env)], f"{base} -m venv {env}")
    else:
        _say(f"updating jupyter-gpushare in the notebook environment {env}")
    _check_safe(env, "bin")  # again, before root runs anything in it
    with tempfile.TemporaryDirectory(prefix="gpushare-wheel-") as tmp:
        _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", tmp,
              str(checkout)], f"building a wheel of {checkout}")
        [wheel] = Path(tmp).glob("jupyter_gpushare-*.whl")
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        if not fresh:  # same version number, new code: replace the package itself
            _run(pip + ["--force-reinstall", "--no-deps", str(wheel)], "reinstalling the wheel")
        _run(pip + [f"{wheel}[demo]"], f"installing jupyter-gpushare into {env}")
    found = subprocess.run(
        [str(python), "-I", "-c", "import jupyter_gpushare.spawner as s, os, sysconfig; "
         "print(os.path.dirname(s.__file__)); print(sysconfig.get_path('scripts'))"],
        capture_output=True, text=True, check=True, cwd="/").stdout.split("\n")
    stamp = {"digest": digest, "python": str(python), "spawner": found[0], "bin": found[1]}
    tmp_stamp = stamp_path.with_suffix(".tmp")
    tmp_stamp.write_text(json.dumps(stamp))
    tmp_stamp.replace(stamp_path)
    _say(f"the notebook environment {env} is ready")
    return stamp
