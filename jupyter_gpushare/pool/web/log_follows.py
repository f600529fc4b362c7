"""Logs followed now (``api/jobs/{id}/logs?follow=1``, each an open connection): at most
``cap`` per user, and whether a user follows any (a build session whose user follows a train
job's output is in use: culling spares it)."""

from __future__ import annotations

from collections import Counter


class Follows:
    def __init__(self, cap: int):
        self.cap = cap
        self._by_user: Counter[str] = Counter()

    def start(self, user: str) -> bool:
        """Count one more follow of ``user``'s; False (and nothing counted) at the cap."""
        if self._by_user[user] >= self.cap:
            return False
        self._by_user[user] += 1
        return True

    def stop(self, user: str) -> None:
        self._by_user[user] -= 1
        if self._by_user[user] <= 0:
            del self._by_user[user]

    def following(self, user: str) -> bool:
        return self._by_user.get(user, 0) > 0
