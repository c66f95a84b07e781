"""How weights reach a generation server by disk: the folders a disk weight sync writes (a Hugging Face
checkpoint, a PEFT adapter) and the adapter-only sync of a LoRA model group (:class:`LoRAAdapterSync`, shared
by the SGLang backends and ``vllm_http``), with the load of a group's adapter at start-up.

Nothing here imports torch or safetensors at module import time.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mas_train.backends.checks import named_tensor_list

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

    from mas_train.config import LoraConfig

logger = logging.getLogger(__name__)

__all__ = ["LoRAAdapterSync", "load_initial_adapter", "write_hf_checkpoint", "write_peft_adapter"]


# -- folders a disk weight sync writes -----------------------------------------------------------------------


def write_hf_checkpoint(
    named_tensors: Sequence[tuple[str, torch.Tensor]],
    out_dir: str | os.PathLike,
    *,
    model_config: PretrainedConfig | None = None,
    source_dir: str | os.PathLike | None = None,
) -> Path:
    """Write ``named_tensors`` as a Hugging Face checkpoint folder a server reloads its weights from (SGLang's
    ``update_weights_from_disk``, vLLM's ``reload_weights``).

    Weights go to ``model.safetensors`` (on CPU and contiguous; a tensor sharing memory with an earlier one,
    e.g. tied embeddings, is written as its own copy, which safetensors requires). The config comes from ``model_config.save_pretrained`` when
    given, else every ``*.json`` is copied from ``source_dir`` (the original model folder).

    Raises:
        ValueError: neither a config object nor a source folder with ``config.json`` is available.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if model_config is not None:
        model_config.save_pretrained(out)
    elif source_dir is not None and (Path(source_dir) / "config.json").is_file():
        for f in Path(source_dir).glob("*.json"):
            if not f.name.endswith(".index.json"):  # an old shard index would point at files we do not write
                shutil.copy2(f, out / f.name)
    else:
        raise ValueError(
            "cannot write a checkpoint for a disk weight sync without a config: pass model_config= "
            "(e.g. model.config) or a model_path folder that has config.json"
        )
    state: dict[str, Any] = {}
    seen: set[int] = set()
    for name, t in named_tensors:
        t = t.detach().to("cpu")
        ptr = t.untyped_storage().data_ptr()
        # safetensors refuses tensors sharing memory (tied embeddings): copy only those, not all 0.5 GB
        if ptr in seen or not t.is_contiguous():
            t = t.contiguous().clone()
        seen.add(t.untyped_storage().data_ptr())
        state[name] = t
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def write_peft_adapter(
    named_tensors: Sequence[tuple[str, torch.Tensor]],
    adapter_name: str,
    lora: LoraConfig,
    out_dir: str | os.PathLike,
) -> Path:
    """Write one adapter's tensors as a PEFT adapter folder (what SGLang's and vLLM's ``load_lora_adapter`` read).

    The folder is what ``PeftModel.save_pretrained`` writes for that adapter: ``adapter_config.json`` (from
    :func:`mas_train.lora.peft_config`, i.e. ``peft.LoraConfig.save_pretrained``) and
    ``adapter_model.safetensors`` with PEFT's saved names, the PeftModel parameter names without the adapter-name
    segment (``...q_proj.lora_A.<name>.weight`` -> ``...q_proj.lora_A.weight``).

    Args:
        named_tensors: ``(name, tensor)`` pairs under PeftModel names (:func:`mas_train.lora.adapter_state`).
        adapter_name: the PEFT adapter name in those names (the model group's name).
        lora: the group's :class:`mas_train.config.LoraConfig`.
        out_dir: folder to write (created; files in it are replaced).

    Raises:
        ValueError: a tensor that is not one of adapter ``adapter_name``'s (e.g. a base weight): a LoRA sync
            never pushes base weights.
    """
    from safetensors.torch import save_file

    from mas_train.lora import is_adapter_param, peft_config

    segment = f".{adapter_name}."
    state: dict[str, Any] = {}
    for name, t in named_tensors:
        if not is_adapter_param(name, adapter_name):
            raise ValueError(
                f"LoRA weight sync of adapter {adapter_name!r} got {name!r}, which is not one of its tensors; "
                "a LoRA group pushes only its adapter (mas_train.lora.adapter_state)"
            )
        head, _, tail = name.rpartition(segment)
        state[f"{head}.{tail}"] = t.detach().to("cpu").contiguous().clone()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    peft_config(lora).save_pretrained(str(out))
    save_file(state, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    return out


# -- the adapter-only sync of a LoRA group -------------------------------------------------------------------


class LoRAAdapterSync:
    """Adapter-only weight sync of a LoRA model group, shared by the SGLang backends and ``vllm_http``.

    A new version is written as a fresh PEFT folder ``adapter_root/<name>-v<N>`` and made the served one; the
    previous folder is deleted once the new one is loaded. SGLang has no in-place update of a loaded adapter
    from a folder: ``load_lora_adapter`` refuses a name that is loaded ("... because it is already loaded",
    ``srt/lora/lora_manager.py::validate_new_adapter``), so there a new version is
    ``unload_lora_adapter(lora_name)`` then ``load_lora_adapter(lora_name, lora_path)``. Subclasses set ``lora_name``, ``lora`` and ``adapter_root`` and implement
    ``_load_lora`` / ``_unload_lora`` with the transport's call. A server that replaces a loaded adapter in
    place (vLLM's ``load_inplace``) sets ``reload_in_place = True``: no unload before the load.
    """

    reload_in_place = False

    lora_name: str | None = None
    lora: Any = None
    adapter_root: Path
    adapter_path: Path | None = None

    def _load_lora(self, name: str, path: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _unload_lora(self, name: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _lora_request_field(self, n: int) -> dict[str, Any]:
        """``{"lora_path": [name] * n}`` (GenerateReqInput.lora_path: adapter *names*, one per prompt) or ``{}``."""
        if self.lora_name is None:
            return {}
        if self.adapter_path is None:
            raise RuntimeError(
                f"LoRA adapter {self.lora_name!r} is not loaded into the server yet: call load_adapter() or "
                "update_weights() with the adapter's tensors first"
            )
        return {"lora_path": [self.lora_name] * n}

    def _push_adapter(self, items: Sequence[tuple[str, torch.Tensor]], version: int) -> Path:
        """Write ``items`` to ``adapter_root/<name>-v<version>`` and make it the served version of the adapter:
        unload the old one (if loaded), load the new one; on a failed load the old version is loaded back."""
        name = self.lora_name
        if name is None:
            raise RuntimeError("this backend serves no LoRA adapter (lora_name is None); it has none to push")
        target = self.adapter_root / f"{name}-v{version}"
        write_peft_adapter(items, name, self.lora, target)
        previous = self.adapter_path
        if previous is not None and not self.reload_in_place:
            self._unload_lora(name)
        try:
            self._load_lora(name, str(target))
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            if previous is not None:
                try:  # keep serving the last good version rather than none
                    self._load_lora(name, str(previous))
                except Exception:  # noqa: BLE001 - the original error is the one to report
                    self.adapter_path = None
                    logger.error("could not load LoRA adapter %s back after a failed sync", previous)
            raise
        if previous is not None and previous != target:
            shutil.rmtree(previous, ignore_errors=True)
        self.adapter_path = target
        return target

    def load_adapter(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> Path:
        """Load the group's adapter as it is now (at start-up, before any update) without bumping
        ``weight_version``; returns the PEFT folder the server loaded.

        Raises:
            RuntimeError: this backend serves no adapter, or the server refused the load (its message
                included).
            ValueError: a tensor that is not the adapter's.
        """
        if self.lora_name is None:
            raise RuntimeError("this backend serves no LoRA adapter (no lora_name)")
        return self._push_adapter(named_tensor_list(named_tensors), int(getattr(self, "weight_version", 0)))


def load_initial_adapter(backend: Any, model: Any) -> Any:
    """Load a LoRA group's adapter as it is at start-up (the PeftModel's), so the first requests already
    select it; nothing for a full fine-tune or without a model. Returns ``backend``.

    Raises:
        ValueError: the model has no adapter of the group's name (the backend is closed).
        RuntimeError: the server refused the load (the backend is closed).
    """
    if backend.lora_name is None or model is None:
        return backend
    from mas_train.lora import adapter_state

    tensors = adapter_state(model, backend.lora_name)
    if not tensors:
        backend.close()
        raise ValueError(
            f"model group {backend.lora_name!r} has a lora section but its model has no adapter of that name"
        )
    try:
        backend.load_adapter(tensors)
    except BaseException:
        backend.close()
        raise
    return backend
