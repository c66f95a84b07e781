"""Which API key goes to which endpoint: a key is sent only to the server it was configured for, and a key over
plain ``http://`` to a host other than loopback is worth a warning (:mod:`mas_train.backends.openai`)."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from mas_train.backends.options import OpenAIOptions

__all__ = ["key_env_for", "private_transport"]


def key_env_for(options: OpenAIOptions) -> str | None:
    """The environment variable whose key is sent to ``options.base_url``: ``api_key_env`` when set, else
    ``OPENAI_API_KEY`` for ``https://api.openai.com`` and ``None`` (send no key) for any other server."""
    if options.api_key_env is not None:
        return options.api_key_env
    url = urlsplit(str(options.base_url))
    return "OPENAI_API_KEY" if url.scheme == "https" and url.hostname == "api.openai.com" else None


def private_transport(base_url: str) -> bool:
    """Whether a request to ``base_url`` stays private: https, or http to a loopback address."""
    url = urlsplit(str(base_url))
    if url.scheme == "https":
        return True
    host = url.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
