"""Local networking helpers shared by the layers that start processes (backend servers, sharded ranks)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it; another process may take it
    before the caller binds it, so callers bind soon after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
