"""The listening socket of a server command (`keel serve --transport http`, `keel inspect`)."""
from __future__ import annotations

import socket


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the command says it is up (raises OSError, e.g. the port is busy), so
    a busy port is one clear line and exit 3 instead of a server that seems to start."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
