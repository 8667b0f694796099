"""core/socket_path.py: the default socket's place, its private directory, the peer check."""

from __future__ import annotations

import os
import socket

import pytest

from uma_serve.core.socket_path import (
    SocketPathError,
    check_peer,
    default_socket,
    make_private_dir,
    peer_uid,
)


def test_the_default_socket_is_in_a_directory_of_the_user():
    assert (
        default_socket({"XDG_RUNTIME_DIR": "/run/user/1000"}, 1000) == "/run/user/1000/uma/uma.sock"
    )
    assert default_socket({}, 1000) == "/tmp/uma-1000/uma.sock"
    assert default_socket({"XDG_RUNTIME_DIR": "relative"}, 1000) == "/tmp/uma-1000/uma.sock"
    assert default_socket({}, 0) == "/run/uma/uma.sock"


def test_the_private_directory_is_made_0700_and_a_shared_one_refused(tmp_path):
    make_private_dir(str(tmp_path / "uma" / "uma.sock"))
    assert (tmp_path / "uma").stat().st_mode & 0o777 == 0o700
    make_private_dir(str(tmp_path / "uma" / "uma.sock"))  # already there: fine
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(SocketPathError, match="another user could replace the socket"):
        make_private_dir(str(shared / "uma.sock"))
    (tmp_path / "file").write_text("")
    with pytest.raises(SocketPathError):
        make_private_dir(str(tmp_path / "file" / "uma.sock"))


def test_a_socket_of_this_user_passes_the_peer_check():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_uid(a) == os.geteuid()
        check_peer(a, "pair")
