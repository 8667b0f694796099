"""Claiming the socket path at start-up: only a stale *socket* is ever removed.

A typo in ``--socket`` must not cost the user a file: a regular file, a directory or anything
else at the path, or a missing parent directory, is an error naming the path, raised before
the model loads.
"""

from __future__ import annotations

import logging
import os
import stat

from uma_serve.core.protocol import socket_answers

log = logging.getLogger("uma.daemon")


class SocketPathError(Exception):
    """The socket path cannot be used; the message names it and says why."""


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
