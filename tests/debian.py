"""Debian packages a test needs, installed with apt-get where they are missing and the tests
run as root (as the PostgreSQL and JupyterLab tests do for theirs)."""

import os
import shutil
import subprocess


def install(package: str) -> None:
    """apt-get install ``package`` (without recommends), updating the lists once if needed;
    nothing where it is not root or has no apt-get: the caller then skips with a sentence."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    if subprocess.run(command, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        subprocess.run(command, env=env, capture_output=True)
