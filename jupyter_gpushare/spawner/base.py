"""What both gpushare spawners do around their parent spawner's lifecycle.

``start()``: pick the user's build profile, reserve its slice at the pool service (waiting,
with progress messages, while the pool is full), compute the slicing mode's fragment, then
start the server the parent's way with the fragment in its environment (and, on Kubernetes,
in its pod). The slice is released when the server stops, when it is found gone, and when a
start fails. Refusals reach the spawn page as one sentence (``SpawnException``).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict
from urllib.parse import urlsplit

from jupyterhub.spawner import Spawner, SpawnException
from jupyterhub.utils import url_path_join
from traitlets import Bool, Dict, Float, List, TraitError, Unicode, default, validate

from ..client import ClientError, PoolError, PoolUnreachable
from . import profiles as build_profiles
from .modes import Fragment
from .reserve import (Held, Refused, SliceClient, release, release_stale, reserve, sentence,
                      tell_server_pid)

POOL_DOWN = ("The GPU pool service is not answering, so no build slice can be reserved; try "
             "again in a minute, or choose CPU only.")
HUB_MISCONFIGURED = ("The hub could not reserve a build slice because of its configuration; "
                     "please tell an administrator.")


def refusal(message: str, reason: str, log_message: str = "") -> SpawnException:
    """A refused start: ``message`` (one sentence) is what the user sees, ``reason`` the
    metrics label, ``log_message`` what the hub's log says instead of the message."""
    exc = SpawnException(message, reason=reason, log_message=log_message)
    # The spawn page and the progress stream show str(exception), with its status code and
    # reason, unless the exception carries the message to show.
    exc.jupyterhub_message = message
    return exc


def _read_at_start(spawner, user_options) -> None:
    """user_options are applied by the spawner's start(), not by this hook."""


class GPUShareSpawnerBase(Spawner):
    """The build-slice lifecycle shared by ``LocalGPUShareSpawner`` and
    ``GPUShareKubeSpawner``; options set on this class apply to both."""

    slice_modes: tuple[str, ...] = ()
    """The slicing modes this spawner can apply (``modes.py``)."""

    build_profiles = List(Dict(), [{"gpus": 0.25, "default": True}, {"gpus": 0.5}, {"gpus": 0}],
                          help="""
        The build profiles users choose from when they start a server: each a dict with
        "gpus" (0 for CPU only, a fraction of one GPU up to 1, or a whole number of GPUs) and
        optionally "display_name", "description", "slug" (what user_options["profile"]
        names), "groups" (only members of these JupyterHub groups see and may use it),
        "default" (the profile of a server started without a choice), "mode" (a slicing mode
        other than slice_mode, e.g. "exclusive" for whole GPUs) and, on Kubernetes,
        "kubespawner_override". Names and descriptions are made from "gpus" when left out
        ("¼ GPU", "½ GPU", "CPU only"). The slices come from the pool service's build pool
        (PoolService.build_nodes), within each user's PoolService.build_allowance.
        """).tag(config=True)

    slice_mode = Unicode(help="""
        How a server gets its slice of a GPU: the documentation's page on slicing modes says
        what each mode enforces and what it does not. The local spawner has "pinned"; the
        Kubernetes spawner "timeslice" (default), "mig", "hami" and "exclusive".
        """).tag(config=True)

    slice_wait_timeout = Float(20.0, min=0, help="""
        Seconds a start waits for room when the build pool is full or the user's build
        allowance is used, telling the user so on the spawn page; then the start fails with
        the pool's reason. 0 refuses at once. Keep it well below start_timeout, which the
        wait counts against.
        """).tag(config=True)

    pool_service = Unicode("gpushare", help="""
        Name of the pool service in c.JupyterHub.services.
        """).tag(config=True)

    pool_url = Unicode(help="""
        Address of the pool service's API as the hub reaches it, to reserve and release
        slices, e.g. http://127.0.0.1:10101/services/gpushare/. Default: the url of the
        service named pool_service in c.JupyterHub.services (straight to the service, not
        through the proxy), else gpushare_url.
        """).tag(config=True)

    gpushare_url = Unicode(help="""
        Address of the pool service as notebook servers and their kernels reach it, given to
        them as GPUSHARE_URL (what %%train, the panel and the gpushare command use). Default:
        JupyterHub.public_url, else the proxy's public address, with the service's prefix
        (/services/gpushare/). Set it where servers reach the hub by another name (on
        Kubernetes e.g. http://proxy-public/services/gpushare/). A GPUSHARE_URL in
        Spawner.environment wins over it.
        """).tag(config=True)

    spawner_service = Unicode("gpushare-spawner", help="""
        Name of the JupyterHub service whose api_token pool_api_token defaults to; the pool
        takes slices only from the service its c.PoolService.spawner_service names (the same
        default, "gpushare-spawner").
        """).tag(config=True)

    pool_api_token = Unicode(help="""
        JupyterHub API token the spawner reserves and releases slices with. The pool accepts
        slices only from the service c.PoolService.spawner_service (and admins): the hub's own
        token is not it, so register a service of its own for the spawner, with access to the
        pool::

            c.JupyterHub.services.append({"name": "gpushare-spawner", "api_token": TOKEN})
            c.JupyterHub.load_roles.append({"name": "gpushare-spawner",
                "services": ["gpushare-spawner"],
                "scopes": ["access:services!service=gpushare"]})

        Default: $GPUSHARE_SPAWNER_TOKEN, else the api_token of the service named
        spawner_service. The token is never logged or given to servers.
        """).tag(config=True)

    kernel_startup = Bool(True, help="""
        Set PYTHONSTARTUP in servers so that every IPython kernel loads the jupyter_gpushare
        extension (%%train, %gpushare) and caps PyTorch's memory to the slice when torch is
        imported. The notebook environment needs jupyter-gpushare installed; without it
        kernels start as usual.
        """).tag(config=True)

    @default("apply_user_options")
    def _options_read_at_start(self):
        # JupyterHub (5.3+) warns of user_options that no hook applies. Ours are read by
        # start(): the build profile, checked there with a sentence for the spawn page
        # (KubeSpawner reads its profile_list options there too).
        return _read_at_start

    @default("server_token_scopes")
    def _default_server_token_scopes(self):
        # JupyterHub's 'server' role, plus access to the pool for kernels and terminals. The
        # hub keeps only the scopes the user holds: users need a role with the access scope.
        def scopes(spawner):
            from jupyterhub import orm
            role = orm.Role.find(spawner.db, "server") if getattr(spawner, "db", None) else None
            base = list(role.scopes) if role else ["users:activity!user",
                                                   "access:servers!server"]
            return base + [f"access:services!service={spawner.pool_service}"]
        return scopes

    @default("slice_mode")
    def _default_slice_mode(self):
        return self.slice_modes[0]

    @validate("slice_mode")
    def _check_slice_mode(self, proposal):
        if proposal.value not in self.slice_modes:
            raise TraitError(f"{type(self).__name__}.slice_mode must be one of "
                             f"{', '.join(self.slice_modes)}, not {proposal.value!r}")
        return proposal.value

    @default("pool_url")
    def _default_pool_url(self):
        service = self._services().get(self.pool_service)
        if service is not None and getattr(service, "url", ""):
            return url_path_join(service.url, service.prefix)
        return self.gpushare_url

    @default("gpushare_url")
    def _default_gpushare_url(self):
        settings = self._settings()
        public = settings.get("public_url")
        if public:
            origin = f"{public.scheme}://{public.netloc}"
        else:
            proxy = urlsplit(getattr(settings.get("proxy"), "public_url", "") or
                             "http://127.0.0.1:8000/")
            host = proxy.hostname or "127.0.0.1"
            host = f"[{host}]" if ":" in host else host
            origin = f"{proxy.scheme}://{host}" + (f":{proxy.port}" if proxy.port else "")
        service = self._services().get(self.pool_service)
        prefix = service.prefix if service is not None else \
            url_path_join(self.hub.base_url[:-4] if self.hub else "/", "services",
                          self.pool_service + "/")
        return origin + prefix

    @default("pool_api_token")
    def _default_pool_api_token(self):
        token = os.environ.get("GPUSHARE_SPAWNER_TOKEN", "")
        if not token:
            service = self._services().get(self.spawner_service)
            token = getattr(service, "api_token", "") or ""
        return token

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._slices: list[Held] = []
        self._fragment: Fragment | None = None
        self._events: list[dict] = []
        self._settled = True
        self._starting = False
        self.profiles  # a mistake in the configuration is reported here, in one sentence

    # -- configuration ------------------------------------------------------------------

    @property
    def profiles(self) -> tuple[build_profiles.BuildProfile, ...]:
        """The admin's build profiles, checked (``TraitError`` with one sentence)."""
        try:
            found = build_profiles.parse(self.build_profiles,
                                         owner=f"{type(self).__name__}.build_profiles",
                                         mode=self.slice_mode, modes=self.slice_modes)
            for profile in found:
                self.check_profile(profile)
        except ValueError as exc:
            raise TraitError(str(exc)) from None
        return found

    def check_profile(self, profile: build_profiles.BuildProfile) -> None:
        """Raise ``ValueError`` (one sentence) where this spawner cannot give ``profile``."""

    def user_groups(self) -> list[str]:
        return [g.name for g in getattr(self.user, "groups", None) or ()]

    def visible_profiles(self) -> list[build_profiles.BuildProfile]:
        return build_profiles.visible_to(self.profiles, self.user_groups())

    def chosen_profile(self) -> build_profiles.BuildProfile:
        """The profile in user_options (or the default one), if this user may have it."""
        slug = (self.user_options or {}).get("profile")
        try:
            return build_profiles.choose(self.profiles, slug, self.user_groups())
        except ValueError as exc:
            raise refusal(str(exc), reason="build_profile") from None

    # -- what subclasses give ------------------------------------------------------------

    def slice_fragment(self, profile: build_profiles.BuildProfile,
                       held: list[Held]) -> Fragment:
        """The slicing mode's fragment for ``profile``, with the slices reserved for it
        (none when the pod is built without a reservation)."""
        raise NotImplementedError

    def kernel_startup_path(self) -> str:
        """PYTHONSTARTUP as the server sees it (``pythonstartup.py``)."""
        raise NotImplementedError

    # -- the lifecycle ----------------------------------------------------------------------

    def current_fragment(self) -> Fragment:
        if self._fragment is None:
            return self.slice_fragment(self.chosen_profile(), list(self._slices))
        return self._fragment

    def get_env(self):
        env = super().get_env()
        env.update(self.current_fragment().env)
        if "GPUSHARE_URL" not in self.environment:
            env["GPUSHARE_URL"] = self.gpushare_url
        if self.kernel_startup:
            env["PYTHONSTARTUP"] = self.kernel_startup_path()
        return env

    async def start(self):
        profile = self.chosen_profile()
        self._events, self._settled, self._starting = [], False, True
        try:
            try:
                if profile.milli:
                    self._slices = await self._reserve(profile)
                else:
                    await self._release_stale_quietly()
                self._fragment = self._fragment_for(profile)
            except BaseException:
                await self._release()
                raise
            finally:
                self._settled = True
            # No await between settling and the parent's start: progress() hands over to
            # the parent's progress only once the parent's start has begun.
            try:
                started = await super().start()
            except BaseException:
                await self._release()
                raise
            pid = getattr(self, "pid", None)  # local servers: the root of its process tree
            if self._slices and pid:
                await tell_server_pid(self._client(), self._slices, pid, self.log)
            return started
        finally:
            self._starting = False

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            await self._release()

    async def poll(self):
        status = await super().poll()
        if status is not None and self._slices and not self._starting:
            await self._release()  # the server ended on its own: its slice is free
        return status

    async def progress(self):
        seen = 0
        while True:
            while seen < len(self._events):
                yield self._events[seen]
                seen += 1
            if self._settled:
                break
            await asyncio.sleep(0.2)
        async for event in super().progress():
            yield event

    def get_state(self):
        state = super().get_state()
        if self._slices:
            state["gpushare_slices"] = [asdict(h) for h in self._slices]
        return state

    def load_state(self, state):
        super().load_state(state)
        self._slices = [Held(**h) for h in state.get("gpushare_slices", [])]

    # Not clear_state: the parent calls it when it finds the process gone, before stop()
    # and poll() here release the slices; they are dropped only once released.

    # -- helpers ----------------------------------------------------------------------------

    def _say(self, message: str) -> None:
        self.log.info("%s: %s", self._log_name, message)
        self._events.append({"progress": 10, "message": message})

    def _client(self) -> SliceClient:
        token = self.pool_api_token
        if not token:
            raise refusal(HUB_MISCONFIGURED, reason="build_slice_config", log_message=(
                f"No token to reserve build slices with: register the JupyterHub service "
                f"{self.spawner_service!r} with an api_token, or set "
                f"{type(self).__name__}.pool_api_token"))
        return SliceClient(self.pool_url, token, timeout=10)

    async def _reserve(self, profile) -> list[Held]:
        client = self._client()
        self._say(f"Reserving {profile.display_name} on the build pool.")
        try:
            await release_stale(client, self.user.name, self.name, self.log)
            held = await reserve(client, self.user.name, self.name, profile.milli,
                                 wait_s=self.slice_wait_timeout, say=self._say)
        except Refused as exc:
            raise refusal(sentence(str(exc)), reason="build_slice") from None
        except PoolUnreachable as exc:
            raise refusal(POOL_DOWN, reason="build_pool_down",
                                 log_message=f"Reserving a build slice: {exc}") from None
        except (PoolError, ClientError) as exc:
            raise refusal(HUB_MISCONFIGURED, reason="build_slice_config",
                                 log_message=f"The pool refused a build slice: {exc}") from None
        where = ", ".join(f"GPU {h.gpu} of {h.node}" for h in held)
        self._say(f"Reserved {profile.display_name}: {where}.")
        return held

    async def _release_stale_quietly(self) -> None:
        # A CPU-only start needs no pool: a slice left from an earlier GPU run of this server
        # is released if the pool answers, and otherwise at the next GPU start.
        if not self.pool_api_token:
            return
        try:
            await release_stale(self._client(), self.user.name, self.name, self.log)
        except ClientError as exc:
            self.log.warning("%s: could not look for leftover build slices: %s",
                             self._log_name, exc)

    def _fragment_for(self, profile) -> Fragment:
        try:
            return self.slice_fragment(profile, list(self._slices))
        except ValueError as exc:
            raise refusal(HUB_MISCONFIGURED, reason="build_slice_config",
                                 log_message=str(exc)) from None

    async def _release(self) -> None:
        ids = [h.id for h in self._slices]
        self._slices, self._fragment = [], None
        if ids:
            kept = await release(self._client(), ids, self.log)
            done = [i for i in ids if i not in kept]
            if done:
                self.log.info("%s: released build slice(s) %s", self._log_name, ", ".join(done))

    def _settings(self) -> dict:
        return getattr(self.user, "settings", None) or {}

    def _services(self) -> dict:
        return self._settings().get("services") or {}
