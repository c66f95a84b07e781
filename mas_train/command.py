"""The plumbing every console command shares (``mas-train``, ``mas-eval``, ``mas-export``, ``mas-compare``...):
one ``prog: error:`` line and exit code 2 for a user mistake (``--debug`` adds the traceback), exit code 130 on
Ctrl-C, and the libraries' chatter silenced."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

__all__ = ["quiet_libraries", "run_command", "user_errors"]


def quiet_libraries() -> None:
    """Silence the libraries' own chatter for a command: tokenizers' fork warning, transformers' info logs and
    the "Generating train split" bars of ``datasets``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated.*")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:
        pass
    try:  # "Generating train split" bars of every data file read
        from datasets.utils.logging import disable_progress_bar

        disable_progress_bar()
    except ImportError:
        pass


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean the user asked for something impossible (never a bug in mas-rl)."""
    from mas_envs.registration import UnknownEnvError
    from mas_train.checkpoint import UnsafeCheckpointError
    from mas_train.config import ConfigError
    from mas_train.models import ModelNotFoundError

    return (
        ConfigError,
        UnknownEnvError,
        FileNotFoundError,
        ImportError,
        ModelNotFoundError,
        UnsafeCheckpointError,
    )


def run_command(prog: str, argv: list[str], body: Callable[[list[str]], object]) -> int:
    """Run ``body(argv)``; print a user mistake as one ``prog: error:`` line (exit 2), Ctrl-C as exit 130."""
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        body(argv)
    except user_errors() as err:
        if debug:
            traceback.print_exc()
        msg = str(err).strip() or type(err).__name__
        print(f"{prog}: error: {msg}", file=sys.stderr)
        if not debug:
            print(f"{prog}: (run with --debug for the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        # mas_train.run.RunInterrupted carries the run folder and its newest checkpoint
        run_dir, ckpt = getattr(err, "run_dir", None), getattr(err, "checkpoint", None)
        if prog == "mas-train" and run_dir is not None:
            if ckpt is not None:
                msg = f"interrupted; continue from its last checkpoint ({ckpt.name}) with --resume {run_dir}"
            else:
                msg = f"interrupted before its first checkpoint, so there is nothing to resume in {run_dir}"
            print(f"mas-train: {msg}", file=sys.stderr)
        else:
            print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0
