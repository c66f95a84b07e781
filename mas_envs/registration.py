"""The env registry: PettingZoo 1.27's own `register` / `make` / `spec`, with our envs in the `mas` namespace.

Ids follow the Gymnasium grammar `[namespace/]name[-vN]`. An id without a namespace means `mas/<id>`, so
`mas_envs.make("math-2agent")` and `pettingzoo.make("aec", "mas/math-2agent")` build the same env (the
newest version when none is given). A third-party package registers its own envs on import::

    mas_envs.register("my-env-v0", entry_point="my_pkg.envs:env", kwargs={"max_loops": 3})
    env = mas_envs.make("my_pkg.envs:my-env-v0")   # imports my_pkg.envs first, then looks the id up

The list of built-in registrations is `mas_envs/envs/__init__.py`.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

import pettingzoo
from pettingzoo.env_registry.exceptions import NameNotFound, PettingZooRegistryError, VersionNotFound
from pettingzoo.env_registry.spec import EnvSpec

__all__ = [
    "NAMESPACE",
    "EnvSpec",
    "UnknownEnvError",
    "make",
    "pprint_registry",
    "register",
    "registry",
    "spec",
]

NAMESPACE = "mas"
# Full ids registered through `register` below, in registration order (the PettingZoo registry also holds
# PettingZoo's own games, which are not ours to list or test).
_OUR_IDS: list[str] = []


class UnknownEnvError(NameNotFound):
    """No registered env matches the id; the message names close matches and how to list all ids."""


def _full_id(env_id: str) -> str:
    return env_id if "/" in env_id else f"{NAMESPACE}/{env_id}"


def register(
    id: str,
    entry_point: Callable[..., Any] | str,
    *,
    kwargs: dict[str, Any] | None = None,
) -> None:
    """Register an env constructor under `id` (in the `mas` namespace when `id` has none).

    Args:
        id: `[namespace/]name-vN`; always give a version, and bump it when prompts, parsing, reward or turn
            order change.
        entry_point: a callable returning the env, or `"module:attr"` (imported only at `make`).
        kwargs: default constructor kwargs; `make(id, **kw)` overrides them.

    Raises:
        pettingzoo.env_registry.exceptions.PettingZooRegistryError: malformed id.
    """
    full = _full_id(id)
    pettingzoo.register("aec", full, entry_point=entry_point, kwargs=dict(kwargs or {}))
    if full not in _OUR_IDS:
        _OUR_IDS.append(pettingzoo.spec("aec", full).id)


def spec(id: str) -> EnvSpec:
    """The `EnvSpec` for `id` (newest version when none is given).

    Raises:
        UnknownEnvError: no such env (the message lists close matches).
    """
    module, _, env_id = id.rpartition(":")
    if module:
        importlib.import_module(module)
    full = _full_id(env_id)
    try:
        return pettingzoo.spec("aec", full)
    except PettingZooRegistryError as e:
        short = {i.removeprefix(f"{NAMESPACE}/") for i in registry()}
        names = sorted(short | {i.rsplit("-v", 1)[0] for i in short})
        close = difflib.get_close_matches(env_id, names, n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        why = "that version is not registered" if isinstance(e, VersionNotFound) else "unknown id"
        raise UnknownEnvError(
            f"No env registered as {id!r} ({why}).{hint} Run mas_envs.pprint_registry() to list all ids; "
            "a third-party env needs its module imported first, or the id written as 'pkg.module:name-v0'."
        ) from None


def make(id: str, **kwargs: Any) -> Any:
    """Build the env registered as `id` with the spec's kwargs updated by `kwargs`.

    `id` may be `"name"`, `"name-vN"`, `"namespace/name-vN"` or `"pkg.module:name-vN"` (imports
    `pkg.module` first, so it can register its envs). Returns a PettingZoo AEC env; `env.unwrapped` is the
    `TextAECEnv`.

    Raises:
        UnknownEnvError: no such env (the message lists close matches).
        pettingzoo.env_registry.exceptions.FailedToImport: the entry point's module failed to import.
    """
    return pettingzoo.make("aec", spec(id), **kwargs)


def registry() -> dict[str, EnvSpec]:
    """All envs registered through `mas_envs.register`, as `{full id: EnvSpec}` in registration order."""
    return {i: pettingzoo.aec_registry[i] for i in _OUR_IDS if i in pettingzoo.aec_registry}


def pprint_registry() -> None:
    """Print every registered `mas_envs` id with its entry point and default kwargs."""
    for env_id, s in registry().items():
        kw = f" {s.kwargs}" if s.kwargs else ""
        entry = (
            s.entry_point if isinstance(s.entry_point, str) else getattr(s.entry_point, "__qualname__", "?")
        )
        print(f"{env_id:32s} {entry}{kw}")
