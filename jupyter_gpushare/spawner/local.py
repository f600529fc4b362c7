"""``LocalGPUShareSpawner``: JupyterHub's local-process spawner with build slices.

Each server is a process on the hub's machine that CUDA lets see only its slice's GPU, named
by UUID in ``CUDA_VISIBLE_DEVICES`` (the ``pinned`` mode), with the framework caps for a
fraction. The UUID comes from the pool service, which knows this machine's build GPUs (or
its labelled simulated ones).
"""

from __future__ import annotations

import os
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Bool, Unicode, default

from . import profiles as build_profiles
from .base import GPUShareSpawnerBase
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
        the JupyterHub user's name. Created when missing.
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
        return str(Path(__file__).with_name("pythonstartup.py"))

    # -- as the hub's user (JupyterHub's SimpleLocalProcessSpawner's behaviour) ------------

    def _hub_user_home(self) -> str:
        return self.hub_user_home_template.format(username=self.user.name)

    def make_preexec_fn(self, name):
        if not self.run_as_hub_user:
            return super().make_preexec_fn(name)
        home = self._hub_user_home()

        def preexec():
            os.makedirs(home, 0o755, exist_ok=True)
            os.chdir(home)

        return preexec

    def get_args(self):
        args = super().get_args()
        if self.run_as_hub_user and os.geteuid() == 0 and "--allow-root" not in args:
            args.append("--allow-root")  # a root hub's servers run as root in this mode
        return args

    def user_env(self, env):
        if not self.run_as_hub_user:
            return super().user_env(env)
        env.update(USER=self.user.name, HOME=self._hub_user_home(), SHELL="/bin/bash")
        return env

    async def move_certs(self, paths):
        if not self.run_as_hub_user:
            return await super().move_certs(paths)
        return paths

