"""``LocalGPUShareSpawner``: JupyterHub's local-process spawner with build slices.

Each server is a process on the hub's machine that CUDA lets see only its slice's GPU, named
by UUID in ``CUDA_VISIBLE_DEVICES`` (the ``pinned`` mode), with the framework caps for a
fraction. The UUID comes from the pool service, which knows this machine's build GPUs (or
its labelled simulated ones).
"""

from __future__ import annotations

import os
import pwd
import signal
import stat
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Bool, Unicode, default

from . import profiles as build_profiles
from .base import GPUShareSpawnerBase, refusal
from .modes import PINNED, Fragment, cpu_only, pinned


class LocalGPUShareSpawner(GPUShareSpawnerBase, LocalProcessSpawner):
    """Notebook servers as local processes, each pinned to its build slice's GPU."""

    slice_modes = (PINNED,)

    run_as_hub_user = Bool(False, help="""
        Run every server as the hub's own user, in hub_user_home_template, like JupyterHub's
        SimpleLocalProcessSpawner, instead of as the user's system account: for one-person
        set-ups and for machines where other accounts cannot run the hub's Python. It gives
        users no isolation from each other: not for shared production use.
        """).tag(config=True)

    hub_user_home_template = Unicode("/tmp/{username}", help="""
        Home (and working) directory of a server when run_as_hub_user is on; {username} is
        the JupyterHub user's name. Made for the hub's user (mode 0700, with its missing
        parents) when missing; a start is refused when it exists and is a link or not the
        hub's user's own folder (another account could have made it first, with start-up
        files in .jupyter or .ipython). A start is also refused when its parent belongs to
        another account than root or the hub's, or others may write in it without it being
        sticky like /tmp (they could swap the home while its server runs).
        """).tag(config=True)

    user_home_template = Unicode(help="""
        Home (and working) directory of servers that run as their users, instead of the home
        of the user's system account; {username} is the JupyterHub user's name. Made for the
        user (theirs, mode 0700) when missing; its parent must exist. A start is refused when
        the folder exists and is a link or not the user's own, or when its parent belongs to
        another account than root, the hub's or the user's, or others may write in it without
        it being sticky like /tmp (they could swap the home while its server runs). Empty:
        the account's home. For test and demo set-ups that must not touch real homes.
        """).tag(config=True)

    kernel_startup_file = Unicode(help="""
        The kernel start-up file (PYTHONSTARTUP) as the servers' Python sees it, when servers
        run another installation of jupyter-gpushare than the hub (a notebook environment of
        their own). Default: the file in the hub's installation.
        """).tag(config=True)

    @default("options_form")
    def _default_options_form(self):
        def form(spawner):
            mine = spawner.visible_profiles()
            if len(mine) < 2:
                return ""  # nothing to choose
            return build_profiles.options_form(mine, (spawner.user_options or {}).get("profile"))
        return form

    @default("options_from_form")
    def _default_options_from_form(self):
        return build_profiles.options_from_form

    def slice_fragment(self, profile, held) -> Fragment:
        if not profile.milli:
            return cpu_only()
        uuids = [h.uuid for h in held]
        if not held or None in uuids:
            raise ValueError(f"the pool service cannot name the GPU of build slice(s) "
                             f"{', '.join(f'{h.node}/{h.gpu}' for h in held) or '(none)'}, so "
                             f"pinned mode cannot pin it: a local build node must be named "
                             f"like this host (or the pool be simulated)")
        return pinned(profile.milli, uuids)

    def kernel_startup_path(self) -> str:
        return self.kernel_startup_file or str(Path(__file__).with_name("pythonstartup.py"))

    # -- as the hub's user (JupyterHub's SimpleLocalProcessSpawner's behaviour) ------------

    def _hub_user_home(self) -> str:
        return self.hub_user_home_template.format(username=self.user.name)

    def _user_home(self) -> str | None:
        """The home a server run as its user gets instead of its account's, if any."""
        if self.run_as_hub_user or not self.user_home_template:
            return None
        return self.user_home_template.format(username=self.user.name)

    async def start(self):
        if self.run_as_hub_user:
            home = self._hub_user_home()
            os.makedirs(os.path.dirname(os.path.abspath(home)), 0o755, exist_ok=True)
            _make_home(home, os.geteuid(), os.getegid(), "the hub's user",
                       "hub_user_home_template")
        elif home := self._user_home():
            try:
                account = pwd.getpwnam(self.user.name)
            except KeyError:
                raise refusal(f"{self.user.name} has no account on this machine, so their "
                              f"server cannot run as them; an administrator adds the account "
                              f"(or sets LocalGPUShareSpawner.run_as_hub_user)",
                              reason="home") from None
            _make_home(home, account.pw_uid, account.pw_gid, self.user.name,
                       "user_home_template")
        return await super().start()

    def make_preexec_fn(self, name):
        if not self.run_as_hub_user:
            become = super().make_preexec_fn(name)
            home = self._user_home()
            if home is None:
                return become

            def preexec_elsewhere():
                become()
                os.chdir(home)

            return preexec_elsewhere
        home = self._hub_user_home()  # made and checked by start()

        def preexec():
            os.chdir(home)

        return preexec

    def get_args(self):
        args = super().get_args()
        if self.run_as_hub_user and os.geteuid() == 0 and "--allow-root" not in args:
            args.append("--allow-root")  # a root hub's servers run as root in this mode
        return args

    def user_env(self, env):
        if not self.run_as_hub_user:
            env = super().user_env(env)
            if self._user_home():
                env["HOME"] = self._user_home()
            return env
        env.update(USER=self.user.name, HOME=self._hub_user_home(), SHELL="/bin/bash")
        return env

    async def stop(self, now=False):
        # JupyterHub asks a server to stop with SIGINT, which jupyter_server treats as a clean
        # stop only when its stdin is a terminal. A spawned server has none: SIGINT raises
        # KeyboardInterrupt, and the server exits without shutting its kernels down (they
        # notice a second later and leave their connection files behind). SIGTERM is its
        # clean stop in every case, so it goes first; the parent's SIGINT, SIGTERM, SIGKILL
        # follow for a server that has not stopped within interrupt_timeout.
        if not now and self.pid and await self.poll() is None:
            self.log.debug("Terminating %i, so that it shuts its kernels down", self.pid)
            await self._signal(signal.SIGTERM)
            await self.wait_for_death(self.interrupt_timeout)
        await super().stop(now=now)

    async def move_certs(self, paths):
        if not self.run_as_hub_user:
            return await super().move_certs(paths)
        return paths



def _make_home(home: str, uid: int, gid: int, whose: str, trait: str) -> None:
    """The folder ``home`` of the account ``uid``: made (0700) and given to it when missing,
    refused when it is a link or not that account's own. It is given through a descriptor
    opened without following links: in a parent others may write, a link swapped in after
    the mkdir must not give the account whatever the link names."""
    refused = refusal(f"{home} is not a folder of {whose}'s own, so no server starts there; "
                      f"remove it or change LocalGPUShareSpawner.{trait}", reason="home")
    parent, name = os.path.split(os.path.abspath(home))
    try:
        at = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        raise refusal(f"{parent} (where {home} would be made) is not a folder; make it or "
                      f"change LocalGPUShareSpawner.{trait}", reason="home") from None
    try:
        held = os.fstat(at)
        if (held.st_uid not in (0, os.geteuid(), uid)
                or (held.st_mode & 0o022 and not held.st_mode & stat.S_ISVTX)):
            raise refusal(f"{parent} (where {home} is) may be changed by other accounts, which "
                          f"could swap the home while its server runs; make it theirs or "
                          f"root's and not writable by others (or sticky, like /tmp), or "
                          f"change LocalGPUShareSpawner.{trait}", reason="home")
        try:
            os.mkdir(name, 0o700, dir_fd=at)
            made = True
        except FileExistsError:
            made = False
        except OSError as e:
            raise refusal(f"{home} cannot be made ({e.strerror}); make it for {whose} or "
                          f"change LocalGPUShareSpawner.{trait}", reason="home") from None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=at)
        except OSError:  # a link (or no longer a folder) where the home should be
            raise refused from None
        try:
            owner = os.fstat(fd).st_uid
            if made and owner == os.geteuid():
                os.fchown(fd, uid, gid)
            elif owner != uid:
                raise refused
        finally:
            os.close(fd)
    finally:
        os.close(at)
