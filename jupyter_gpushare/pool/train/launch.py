"""How a stored job runs: the ``Launch`` a backend gets for its next attempt."""

from __future__ import annotations

import pwd
from pathlib import Path

from ...backends.base import Backend, Launch
from ..store.models import JobRow


class Launcher:
    def __init__(self, backend: Backend, checkpoint_dir_template: str, state_dir: str):
        self.backend = backend
        self.checkpoint_dir_template = checkpoint_dir_template
        self.state_dir = state_dir

    def home_of(self, user: str) -> str:
        """Where the user's jobs keep their checkpoints: the backend's home of the user, the
        user's account's, or a folder of the service's for users without an account here."""
        home = self.backend.user_home(user)
        try:
            return home or pwd.getpwnam(user).pw_dir
        except KeyError:
            return str(Path(self.state_dir) / "home" / user)

    def __call__(self, row: JobRow) -> Launch:
        checkpoint = self.checkpoint_dir_template.format(home=self.home_of(row.user),
                                                         user=row.user, job_id=row.id)
        return Launch(row.id, row.attempt, row.user, row.project, tuple(row.command),
                      dict(row.env), dict(row.placement), checkpoint, row.workdir,
                      per_gpu=bool(row.per_gpu))
