"""A local gang's private network: a network namespace of its own, with only a loopback.

The ranks of a local gang meet at ``127.0.0.1:MASTER_PORT``, and most frameworks' rendezvous
(``torch.distributed``'s TCPStore, NCCL's bootstrap, JAX's coordinator) take whoever connects
first, with no secret. On the machine's own loopback every local account could take that port
before rank 0 listens, or connect to rank 0 as one of the ranks. In a namespace of the gang's
own, its loopback, ports and abstract Unix sockets are the gang's alone: another account (not
root) can neither enter the namespace nor reach into it, and the ranks cannot leave it.

The shim of the gang's first node makes the namespace (``make``); the shims of its other nodes
join it (``join``), each before it starts any rank. Both need root: the shims run as root
where the service does, and only the forked ranks become the user. Standard library only
(``ctypes`` for ``unshare`` and ``setns``, which Python has only from 3.12): the shim loads it
by path.
"""

import ctypes
import errno
import fcntl
import os
import socket
import struct
import time

CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH14x"  # struct ifreq: the name, then ifr_flags
JOIN_S = 30.0  # how long the other nodes wait for the first one's namespace


def make():
    """Move this process (and the ranks it will fork) into a new network namespace and bring
    its loopback up. Raises OSError (``EPERM`` without root, or where a container forbids it)."""
    _check(_libc().unshare(CLONE_NEWNET))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, _ifreq(0)))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, _ifreq(flags | _IFF_UP))


def join(pid, start, proc_stat, timeout=JOIN_S):
    """Move this process into the namespace that process ``pid`` (started at clock tick
    ``start``: a reused pid is not it) made with ``make``, once it has made it and its loopback
    is up. ``proc_stat(pid)`` is the shim's reader of ``/proc/<pid>/stat``. Raises OSError
    when that process ends first or ``timeout`` passes."""
    mine = os.stat("/proc/self/ns/net").st_ino
    users = os.stat("/proc/self/ns/user").st_ino
    deadline = time.monotonic() + timeout
    while True:
        if not _same(proc_stat(pid), start):
            raise OSError(errno.ESRCH, "the gang's first node ended before its network was made")
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = None
        if fd is not None:
            try:
                # still that process after the open, ours (a shim of this service, not a
                # process of a user's own namespaces), and in a network namespace of its own
                if (_same(proc_stat(pid), start) and _ours(pid, users)
                        and os.fstat(fd).st_ino != mine):
                    _check(_libc().setns(fd, CLONE_NEWNET))
                    break
            finally:
                os.close(fd)
        if time.monotonic() > deadline:
            raise OSError(errno.ETIMEDOUT, "the gang's first node did not make its network")
        time.sleep(0.01)
    while not loopback_up():
        if time.monotonic() > deadline:
            raise OSError(errno.ETIMEDOUT, "the loopback of the gang's network did not come up")
        time.sleep(0.01)


def loopback_up():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return bool(struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, _ifreq(0)))[1] & _IFF_UP)


def _ifreq(flags):
    return struct.pack(_IFREQ, b"lo", flags)


def _ours(pid, users):
    """The process runs as this one's user, in this one's user namespace: a user's
    ``unshare -Urn`` namespace is never joined."""
    try:
        return (os.stat(f"/proc/{pid}").st_uid == os.geteuid()
                and os.stat(f"/proc/{pid}/ns/user").st_ino == users)
    except OSError:
        return False


def _same(stat, start):
    return stat is not None and stat[2] == start


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result):
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
