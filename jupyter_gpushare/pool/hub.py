"""The one client of JupyterHub's REST API: who a token is (``web/identity.py``), a user's rights
(``web/identity.py``), which servers run and when they were active (``housekeeping.py``,
``build/culler.py``), stopping a server (``build/culler.py``).

Asked without blocking the event loop, with the service's own token unless a caller's is
given. What went wrong is one of three exceptions, each a sentence, so that every caller
decides what it means for it: ``HubNotFound`` (404), ``HubRefused`` (401, 403: the token is
unknown, or its role lacks a scope) and ``HubUnavailable`` (no answer, another status, or not
JSON)."""

from __future__ import annotations

import json
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest


class HubError(Exception):
    """The hub did not give what was asked; the message is one sentence."""


class HubNotFound(HubError):
    """The hub has no such thing (404)."""


class HubRefused(HubError):
    """The hub refused the token (401) or its role lacks the scope (403)."""


class HubUnavailable(HubError):
    """The hub did not answer, or not as it should (HTTP 503 for a user of the pool)."""


class HubAPI:
    def __init__(self, api_url: str, token: str, timeout_s: float = 10.0):
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def __bool__(self) -> bool:
        """Whether there is a hub to ask (a service started outside JupyterHub has none)."""
        return bool(self.api_url)

    async def get(self, path: str, token: str | None = None) -> dict:
        """The hub's JSON at ``path`` (relative to the API's URL)."""
        body = await self._fetch("GET", path, token)
        try:
            return json.loads(body)
        except ValueError:
            raise HubUnavailable("JupyterHub's answer was not JSON") from None

    async def delete(self, path: str) -> None:
        await self._fetch("DELETE", path, None)

    async def user(self, name: str) -> dict:
        """``GET users/{name}``, the name quoted; an answer for another user is not taken."""
        model = await self.get(f"users/{quote(name, safe='')}")
        if model.get("name") != name:
            raise HubUnavailable(f"JupyterHub answered for user {model.get('name')!r} when "
                                 f"asked for {name!r}")
        return model

    async def _fetch(self, method: str, path: str, token: str | None) -> bytes:
        req = HTTPRequest(f"{self.api_url}/{path}", method=method,
                          headers={"Authorization": f"token {token or self.token}"},
                          request_timeout=self.timeout_s, allow_nonstandard_methods=True)
        try:
            return (await AsyncHTTPClient().fetch(req)).body
        except HTTPClientError as e:
            if e.code == 404:
                raise HubNotFound(f"JupyterHub has no {path}") from None
            if e.code in (401, 403):
                raise HubRefused(f"JupyterHub refused {method} {path} ({e.code})") from None
            raise HubUnavailable(f"JupyterHub answered {e.code}") from None
        except OSError as e:
            raise HubUnavailable(f"JupyterHub cannot be reached ({e})") from None
