"""The generic half of configuration, on OmegaConf: YAML files, CLI flags and dotted overrides merged over a
dataclass schema, with OmegaConf's type checks and coercion, its errors turned into one :class:`ConfigError`
line each.

Why OmegaConf (2.4): its structured configs take our dataclasses as they are, including the nested
``dict[str, AgentConfig]`` / ``dict[str, ModelGroupConfig]`` sections (a new key of such a section becomes a
full, typed, defaulted section), ``str | dict`` unions (``model_sharing``), free ``dict[str, Any]`` sections
(``grpo``, ``env_kwargs``) and ``Optional`` fields; merging layers (defaults < saved run config < ``--config``
file < flags) is one ``OmegaConf.merge``; unknown keys and bad types are detected at the exact dotted path;
and ``OmegaConf.to_object`` builds the dataclasses, so their ``__post_init__`` checks run. ``HfArgumentParser``
/ ``TrlParser`` handle flat fields only; jsonargparse and tyro handle the nesting but not a flag that creates a
section under a new dict key (``--agents.verifier.sampling.temperature``) the way users write it today.

What stays ours (small): argparse for ``--help`` (generated from the fields' help text) and to tell known
top-level flags from dotted ones, and reading one flag's text into a value by the schema's type at its path
(a ``str`` field keeps ``no`` as text; ``a=1,b=x`` fills a mapping; ``none`` empties an optional field).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union, cast

from mas_train.config.common import ConfigError, close_matches

if TYPE_CHECKING:
    from omegaconf import DictConfig

_T = TypeVar("_T")

__all__ = [
    "ArgParser",
    "build",
    "build_argparser",
    "cli_overrides",
    "field_type",
    "join_negative_values",
    "load_yaml",
]

_NONE = {"none", "null", "~"}


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)``; other types -> ``(tp, False)``."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        if len(args) == 1:
            return args[0], optional
        return Union[tuple(args)], optional  # noqa: UP007 -- rebuilt at run time from a tuple
    return tp, False


def field_type(cls: type, path: Sequence[str]) -> Any:
    """The annotated type at a dotted ``path`` below dataclass ``cls`` (dict keys step into the value type);
    ``None`` where the schema does not say (``Any``, a union, an unknown key)."""
    tp: Any = cls
    for seg in path:
        base, _ = unwrap_optional(tp)
        if dataclasses.is_dataclass(base):
            hints = typing.get_type_hints(base)
            if seg not in hints:
                return None
            tp = hints[seg]
        elif typing.get_origin(base) is dict:
            tp = typing.get_args(base)[1]
        else:
            return None
    return tp


def _is_mapping_type(tp: Any) -> bool:
    base, _ = unwrap_optional(tp)
    if typing.get_origin(base) is dict:
        return True
    return typing.get_origin(base) in (Union, types.UnionType) and any(
        typing.get_origin(a) is dict for a in typing.get_args(base)
    )


def _scalar(text: str) -> Any:
    """One flag value by OmegaConf's YAML grammar (``3``, ``1e-5``, ``true``, ``[a, b]``, ``{a: 1}``)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    try:
        value = OmegaConf.from_dotlist([f"v={text}"])["v"]
    except Exception:  # noqa: BLE001 -- anything OmegaConf cannot read is taken as the text itself
        return text
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value)
    return value


def _mapping(text: str, flag: str) -> dict[str, Any]:
    """``a=1,b=x`` or a YAML mapping ``{a: 1, b: x}``."""
    text = text.strip()
    if text.startswith("{"):
        value = _scalar(text)
        if not isinstance(value, dict):
            raise ConfigError(f"{flag}: expected a mapping, got {text!r}")
        return value
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ConfigError(
                f"{flag}: expected key=value pairs separated by commas, got {part!r} in {text!r}"
            )
        k, v = part.split("=", 1)
        out[k.strip()] = _scalar(v.strip())
    return out


def read_value(text: Any, tp: Any, flag: str) -> Any:
    """A flag's text (or texts, for a list flag) as a value of schema type ``tp`` (``None`` = unknown)."""
    base, optional = unwrap_optional(tp)
    if isinstance(text, list):
        item = typing.get_args(base)[0] if typing.get_origin(base) is list else None
        parts = [p.strip() for t in text for p in str(t).split(",") if p.strip()]
        return [p if item is str else _scalar(p) for p in parts]
    if text.strip().lower() in _NONE and (optional or tp is None or tp is Any):
        return None
    if base is str:
        return text
    if _is_mapping_type(base):
        return _mapping(text, flag) if "=" in text or text.strip().startswith("{") else text
    return _scalar(text)


def _set_path(tree: dict[str, Any], path: Sequence[str], value: Any) -> None:
    for key in path[:-1]:
        node = tree.get(key)
        if not isinstance(node, dict):
            node = tree[key] = {}
        tree = node
    tree[path[-1]] = value


def _translate(err: Exception, where: str) -> ConfigError:
    """One line for an OmegaConf error, naming the dotted setting."""
    key = getattr(err, "full_key", None) or ""
    path = ".".join(p for p in (where, str(key)) if p)
    msg = str(getattr(err, "msg", None) or err).splitlines()[0]
    kind = type(err).__name__
    if kind in ("ConfigKeyError", "ConfigAttributeError", "KeyValidationError") and "not in" in msg:
        obj = getattr(err, "object_type", None)
        names = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else []
        leaf = str(key).rsplit(".", 1)[-1]
        known = f" Known here: {', '.join(names)}" if names else ""
        return ConfigError(f"unknown setting {path!r}.{close_matches(leaf, names)}{known}")
    m = re.match(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", msg)
    if m:
        want = {"Integer": "int", "Float": "float", "Boolean": "bool", "String": "str"}.get(m[3], m[3])
        return ConfigError(f"{path}: cannot read {m[1]!r} as {want}")
    if kind == "MissingMandatoryValue":
        return ConfigError(f"{path} is required")
    return ConfigError(f"{path}: {msg}")


ENV_INTERPOLATION_VAR = "MAS_RL_CONFIG_ENV"
"""Set to ``1`` to let config values read environment variables with OmegaConf's ``${oc.env:VAR}``."""

_ENV_RE = re.compile(r"\$\{\s*oc\s*\.\s*env\s*:")


def _refuse_env_interpolation(layers: Sequence[Any], where: str) -> None:
    """Refuse ``${oc.env:...}`` in any value unless ``MAS_RL_CONFIG_ENV=1``.

    A value that reads the environment copies it wherever the config goes (the run folder name, config.yaml,
    the terminal), and a config file or a downloaded checkpoint's config.yaml could name any secret; so reading
    the environment is the user's explicit choice on the machine that runs, never the file's.
    """
    if os.environ.get(ENV_INTERPOLATION_VAR) == "1":
        return

    def walk(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        elif isinstance(node, str) and _ENV_RE.search(node):
            raise ConfigError(
                f"{path}: {node!r} reads an environment variable (${{oc.env:...}}), which config values may not "
                f"do unless you set {ENV_INTERPOLATION_VAR}=1 (the value is then written to config.yaml and "
                "the run folder like any other); give the value itself instead"
            )

    for layer in layers:
        walk(layer, where)


def build(
    cls: type[_T],
    layers: Sequence[Mapping[str, object]],
    *,
    where: str = "",
    fixup: Callable[[DictConfig], None] | None = None,
) -> _T:
    """Merge ``layers`` (mappings, later wins) over the schema of dataclass ``cls`` and build the instance.

    Args:
        fixup: called with the merged ``DictConfig`` before the dataclasses are built.
        where: dotted prefix for messages (e.g. ``model_groups.a.backend_options``).

    Raises:
        ConfigError: unknown key (with close matches), a value of the wrong type, a missing required value, or
            an invalid value (the dataclasses' own checks).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _refuse_env_interpolation(layers, where)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), *[OmegaConf.create(dict(x)) for x in layers])
        if fixup is not None:
            fixup(cast("DictConfig", merged))  # the merge of a structured dataclass schema is a DictConfig
        return cast(_T, OmegaConf.to_object(merged))  # OmegaConf builds ``cls`` from its structured schema
    except ConfigError:
        raise
    except OmegaConfBaseException as err:
        raise _translate(err, where) from None
    except ValueError as err:  # a dataclass check that raises a plain ValueError
        raise ConfigError(f"{where}: {err}" if where else str(err)) from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file as a plain dict (OmegaConf's YAML grammar: ``1e-5`` is a number).

    Raises:
        ConfigError: no such file, invalid YAML, or not a mapping at top level.
    """
    from omegaconf import DictConfig, OmegaConf

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = OmegaConf.load(path)
    except Exception as err:  # noqa: BLE001 -- yaml's parser errors have no common public base here
        raise ConfigError(
            f"config file {str(path)!r} is not valid YAML: {str(err).splitlines()[0]}"
        ) from None
    if not isinstance(data, DictConfig):
        raise ConfigError(f"config file {str(path)!r} must hold a YAML mapping at top level")
    return OmegaConf.to_container(data)  # type: ignore[return-value]


class ArgParser(argparse.ArgumentParser):
    """argparse whose errors are :class:`ConfigError` (one line, exit code chosen by the caller)."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


def build_argparser(
    cls: type,
    prog: str,
    description: str,
    epilog: str,
    skip: Sequence[str] = (),
    notes: Mapping[str, str] | None = None,
) -> ArgParser:
    """An argparse parser with one flag per field of ``cls`` (help from the field's metadata); a dataclass
    field gets one flag per sub-field (``--sampling.temperature``); fields in ``skip`` get none. ``notes``
    (dotted flag name -> text) is appended to a flag's help, after its default."""
    notes = notes or {}

    def noted(name: str, text: str) -> str:
        return f"{text}; {notes[name]}" if name in notes else text

    parser = ArgParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        tp, optional = unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            group = parser.add_argument_group(f"{f.name} ({f.metadata['help']})")
            if optional:  # an optional section can be switched off as a whole
                group.add_argument(
                    f"--{f.name}", dest=f.name, metavar="none", help=f"'none' switches {f.name} off"
                )
            for sf in dataclasses.fields(tp):
                name = f"{f.name}.{sf.name}"
                text = sf.metadata["help"]
                if not optional and sf.default is not dataclasses.MISSING:
                    text = f"{text} (" + noted(name, f"default: {sf.default}") + ")"
                elif name in notes:
                    text = f"{text} ({notes[name]})"
                group.add_argument(f"--{name}", dest=name, metavar="V", help=text)
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "required"
        help_text = f"{f.metadata['help']} (" + noted(f.name, f"default: {default}") + ")"
        if tp is bool:
            parser.add_argument(f"--{f.name}", nargs="?", const="true", metavar="BOOL", help=help_text)
        elif typing.get_origin(tp) is list:
            parser.add_argument(f"--{f.name}", nargs="+", metavar="V", help=help_text)
        else:
            parser.add_argument(f"--{f.name}", metavar="V", help=help_text)
    return parser


# A negative number in any notation Python reads (-1, -.5, -1e-4, -inf). argparse takes only -1 and -.5 as values
# and reads -1e-4 as an unknown option ("expected one argument"), so such a value is joined to its flag.
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-inf(inity)?$", re.IGNORECASE)


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """``argv`` with each ``--flag -1e-4`` written ``--flag=-1e-4``, so argparse reads a negative number in
    scientific notation as the flag's value (its own rule takes only ``-1`` and ``-.5``)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if (
            token.startswith("--")
            and "=" not in token
            and i + 1 < len(argv)
            and _NEGATIVE_NUMBER.match(argv[i + 1])
        ):
            out.append(f"{token}={argv[i + 1]}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def cli_overrides(
    cls: type, parser: argparse.ArgumentParser, argv: Sequence[str], special: Sequence[str] = ()
) -> tuple[dict[str, Any], list[tuple[tuple[str, ...], Any]]]:
    """Split ``argv`` into the ``special`` flags' raw values and ``(dotted path, value)`` overrides of ``cls``.

    A flag of a mapping field given as ``k=v,...`` becomes one override per key, so that it merges with dotted
    flags and the config file instead of replacing them.

    Raises:
        ConfigError: an unknown flag (with close matches), a dotted flag without a value, a stray argument.
    """
    ns, rest = parser.parse_known_args(join_negative_values(argv))
    given = vars(ns)
    specials = {k: given.pop(k) for k in list(given) if k in special}
    pairs: list[tuple[tuple[str, ...], Any]] = []

    def add(path: tuple[str, ...], text: Any, flag: str) -> None:
        tp = field_type(cls, path)
        if dataclasses.is_dataclass(unwrap_optional(tp)[0]):  # --section none (build_argparser)
            if len(path) > 1:
                # a nested section left unset inherits the top-level one, so 'none' there could not mean "off"
                raise ConfigError(
                    f"{flag} cannot be switched off on its own (unset, it inherits --{path[-1]}); switch the "
                    f"top-level one off (--{path[-1]} none) and set {flag}.<name> where you want it"
                )
            if str(text).strip().lower() not in ("none", "null"):
                raise ConfigError(f"{flag} takes only 'none' (off); set its fields with {flag}.<name> VALUE")
            pairs.append((path, None))
            return
        value = read_value(text, tp, flag)
        base, _ = unwrap_optional(tp)
        if isinstance(value, dict) and typing.get_origin(base) is dict and value:
            pairs.extend((path + (str(k),), v) for k, v in value.items())
        else:
            pairs.append((path, value))

    for key, text in given.items():
        add(tuple(key.split(".")), text, f"--{key}")

    hints = typing.get_type_hints(cls)
    nested = [
        n for n, t in hints.items() if _is_mapping_type(t) or dataclasses.is_dataclass(unwrap_optional(t)[0])
    ]
    known_flags = [a for action in parser._actions for a in action.option_strings]
    i = 0
    while i < len(rest):
        token = rest[i]
        if not token.startswith("--"):
            raise ConfigError(f"unexpected argument {token!r}; flags look like --name value")
        flag, eq, text = token[2:].partition("=")
        path = tuple(flag.split("."))
        if path[0] not in nested or len(path) < 2 or not all(path):
            raise ConfigError(f"unknown flag --{flag}.{close_matches('--' + flag, known_flags)} See --help.")
        section = unwrap_optional(hints[path[0]])[0]
        if typing.get_origin(section) is dict and dataclasses.is_dataclass(typing.get_args(section)[1]):
            if len(path) < 3:
                raise ConfigError(f"--{flag}: expected --{path[0]}.<name>.<setting> VALUE")
        if not eq:
            if i + 1 >= len(rest) or rest[i + 1].startswith("--"):
                raise ConfigError(f"--{flag} needs a value")
            i += 1
            text = rest[i]
        add(path, text, f"--{flag}")
        i += 1
    return specials, pairs


def overrides_tree(pairs: Sequence[tuple[Sequence[str], Any]]) -> dict[str, Any]:
    """``(path, value)`` pairs as one nested dict."""
    tree: dict[str, Any] = {}
    for path, value in pairs:
        _set_path(tree, list(path), value)
    return tree


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{dotted path: leaf}``; lists are leaves, empty mappings are left out."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(flatten(v, path))
        else:
            out[path] = v
    return out
