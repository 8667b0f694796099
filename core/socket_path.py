"""Where the core's socket lives, who may serve it, and claiming its path at start-up.

The default socket is in a directory only its user can write: ``$XDG_RUNTIME_DIR/uma/uma.sock``,
without XDG_RUNTIME_DIR ``/run/uma/uma.sock`` for root and ``/tmp/uma-UID/uma.sock`` for others;
umad creates that directory with mode 0700, so no other local user can squat the path while
umad is down. A client (the library, uma-cli, the gateway) sends nothing to a socket served by
another user than itself or root (``check_peer``, from the kernel's SO_PEERCRED).

Claiming: only a stale *socket* is ever removed. A typo in ``--socket`` must not cost the
user a file: a regular file, a directory or anything else at the path, or a missing parent
directory, is an error naming the path, raised before the model loads.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import struct

from uma_serve.core.protocol import socket_answers

log = logging.getLogger("uma.daemon")


DEFAULT_SOCKET_DOC = "$XDG_RUNTIME_DIR/uma/uma.sock"  # default_socket(), as the docs write it


class SocketPathError(Exception):
    """The socket path cannot be used; the message names it and says why."""


class UntrustedSocketError(PermissionError):
    """The socket is served by another user than this process's (or root)."""


def default_socket(environ: dict[str, str] | None = None, uid: int | None = None) -> str:
    """The socket path umad, uma-cli, the client library and the gateway use by default."""
    env = os.environ if environ is None else environ
    uid = os.geteuid() if uid is None else uid
    runtime_dir = env.get("XDG_RUNTIME_DIR", "")
    if runtime_dir and os.path.isabs(runtime_dir):
        return os.path.join(runtime_dir, "uma", "uma.sock")
    return "/run/uma/uma.sock" if uid == 0 else f"/tmp/uma-{uid}/uma.sock"


def make_private_dir(path: str) -> None:
    """Create the socket's directory (mode 0700) if missing; refuse one that another user
    owns or that others may write (they could replace the socket)."""
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.mkdir(parent, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SocketPathError(f"cannot create the socket's directory {parent}: {exc}") from None
    info = os.lstat(parent)
    if not stat.S_ISDIR(info.st_mode):
        raise SocketPathError(f"{parent} is not a directory; not serving there")
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise SocketPathError(
            f"{parent} is owned by uid {info.st_uid} (mode {stat.S_IMODE(info.st_mode):04o}): "
            "another user could replace the socket; not serving there (give --socket)"
        )


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process serving the connected Unix socket ``sock``."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def check_peer(sock: socket.socket, path: str) -> None:
    """Raise UntrustedSocketError unless ``sock`` is served by this user or root: a socket
    another local user bound (in a shared directory, or at a default path while umad was
    down) never gets a request."""
    uid, me = peer_uid(sock), os.geteuid()
    if uid not in (me, 0):
        msg = f"the socket is served by uid {uid}, not by this user (uid {me}) or root"
        raise UntrustedSocketError(errno.EPERM, msg, path)


def claim_socket_path(path: str) -> None:
    """Make ``path`` free for a new listening socket, or raise SocketPathError."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise SocketPathError(f"--socket {path}: the directory {parent} does not exist")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a regular file"
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            kind = "not a socket"
        raise SocketPathError(f"--socket {path}: {kind} is there; not removing it")
    if socket_answers(path):
        raise SocketPathError(f"another daemon is serving on {path}; not taking it over")
    log.info("removing stale socket %s", path)
    os.unlink(path)
