"""In-process ``sglang.Engine`` backend (one engine per model group)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mas_train.backends.base import GenerationOutput, SamplingParams
from mas_train.backends.checks import named_tensor_list, per_prompt_sampling, validate_prompts
from mas_train.backends.sglang.wire import (
    INSTALL_HINT,
    check_result,
    parse_sglang_outputs,
    result_ok,
    to_sglang_sampling_params,
    weight_buckets,
    write_hf_checkpoint,
)
from mas_train.backends.weight_sync import LoRAAdapterSync

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

__all__ = ["SGLangEngineBackend"]


class SGLangEngineBackend(LoRAAdapterSync):
    """Generation through an in-process ``sglang.Engine`` (one per model group).

    Args:
        model_path: Hugging Face model folder or hub id the engine serves (also the config source for the
            disk fallback of :meth:`update_weights`).
        tokenizer: the model group's tokenizer; used to cut completions at stop strings defensively.
        engine: an existing engine object (or a test double with the same methods); when ``None`` one is
            built with ``sglang.Engine(...)`` from the arguments below.
        mem_fraction_static: fraction of GPU memory SGLang reserves for weights + KV cache (e.g. ``0.35`` so
            that two engines and the trainers share one GPU; see ``docs/scaling.md``).
        tp_size: tensor-parallel size of the engine.
        base_gpu_id: first GPU index the engine uses (``gpu_ids[0]`` of the model group).
        random_seed: the engine's sampling seed.
        enable_memory_saver: build with ``torch_memory_saver`` so :meth:`sleep` can release weights and KV
            cache while the trainer updates on the same GPU (colocated mode). Without it sleep/wake are no-ops.
        weight_sync: ``"tensor"`` (CUDA-IPC ``update_weights_from_tensor``, trainer on the same node),
            ``"disk"`` (write a safetensors folder and ``update_weights_from_disk``) or ``"auto"`` (tensor when
            the engine has it and CUDA is available, else disk).
        model_config: a ``transformers`` config used to write the disk checkpoint (default: copy the JSON
            files of ``model_path``).
        bucket_bytes: upper bound of one ``update_weights_from_tensor`` call's payload.
        tensor_device: device tensors are moved to before ``update_weights_from_tensor`` (SGLang needs CUDA
            tensors); default ``"cuda"`` when available, else tensors are passed as they are.
        engine_kwargs: any further ``sglang.ServerArgs`` fields.
        lora_name: the SGLang adapter name of a LoRA model group (the group's name); ``None`` for a full
            fine-tune. Every request then carries ``lora_path=[lora_name, ...]`` and :meth:`update_weights`
            takes only the adapter's tensors (see :meth:`load_adapter`).
        lora: the group's :class:`mas_train.config.LoraConfig` (written as the adapter's ``adapter_config.json``).
        adapter_dir: folder for the versioned PEFT adapter folders SGLang loads; default a temp folder.

    ``weight_version`` starts at 0 and increases by one per successful :meth:`update_weights`; every output
    carries the version it was sampled with.
    """

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        engine: Any = None,
        mem_fraction_static: float | None = None,
        tp_size: int = 1,
        base_gpu_id: int = 0,
        random_seed: int | None = None,
        enable_memory_saver: bool = False,
        weight_sync: str = "auto",
        model_config: Any = None,
        bucket_bytes: int = 512 * 1024**2,
        tensor_device: str | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        lora_name: str | None = None,
        lora: Any = None,
        adapter_dir: str | os.PathLike | None = None,
    ) -> None:
        if (lora_name is None) != (lora is None):
            raise ValueError(
                "SGLangEngineBackend: pass lora_name and lora together (a LoRA group), or neither"
            )
        if weight_sync not in ("auto", "tensor", "disk"):
            raise ValueError(f"weight_sync must be 'auto', 'tensor' or 'disk', got {weight_sync!r}")
        if mem_fraction_static is not None and not 0 < mem_fraction_static < 1:
            raise ValueError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static}")
        if tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {tp_size}")
        self.model_path = None if model_path is None else str(model_path)
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.bucket_bytes = int(bucket_bytes)
        self.enable_memory_saver = bool(enable_memory_saver)
        self.weight_version = 0
        self._asleep = False
        self._closed = False
        self.lora_name = lora_name
        self.lora = lora
        self.adapter_path = None
        self._tmp_adapter_dir = (
            None if adapter_dir is not None else tempfile.mkdtemp(prefix="mas_sglang_lora_")
        )
        self.adapter_root = Path(adapter_dir) if adapter_dir is not None else Path(str(self._tmp_adapter_dir))
        self._owns_engine = engine is None
        if engine is None:
            if self.model_path is None:
                raise ValueError("SGLangEngineBackend needs model_path= (or an engine= object)")
            kwargs: dict[str, Any] = {
                "model_path": self.model_path,
                "tp_size": int(tp_size),
                "base_gpu_id": int(base_gpu_id),
                "enable_memory_saver": self.enable_memory_saver,
            }
            if mem_fraction_static is not None:
                kwargs["mem_fraction_static"] = float(mem_fraction_static)
            if random_seed is not None:
                kwargs["random_seed"] = int(random_seed)
            kwargs.update(engine_kwargs or {})
            try:
                import sglang
            except ImportError as e:
                raise ImportError(INSTALL_HINT) from e
            engine = sglang.Engine(**kwargs)
        self.engine = engine

        cuda = _cuda_available()
        if weight_sync == "auto":
            weight_sync = "tensor" if hasattr(engine, "update_weights_from_tensor") and cuda else "disk"
        self.weight_sync = weight_sync
        self.tensor_device = tensor_device if tensor_device is not None else ("cuda" if cuda else None)
        # sglang >= 0.5.23 refuses tensor updates outside a begin/end session; older versions lack the calls
        self.has_update_session = hasattr(engine, "begin_weight_update") and hasattr(
            engine, "end_weight_update"
        )

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams],
    ) -> list[GenerationOutput]:
        """Sample one completion per prompt with ``engine.generate(input_ids=..., return_logprob=True)``.

        Raises:
            RuntimeError: the backend is asleep or closed, or SGLang's answer is malformed or aborted.
            ValueError: an empty prompt, or a sampling list of the wrong length.
        """
        self._check_usable()
        prompts = validate_prompts(prompt_ids)
        samplings = per_prompt_sampling(prompts, sampling)
        if not prompts:
            return []
        version = self.weight_version
        outs = self.engine.generate(
            input_ids=prompts,
            sampling_params=[to_sglang_sampling_params(s) for s in samplings],
            return_logprob=True,
            **self._lora_request_field(len(prompts)),
        )
        return parse_sglang_outputs(outs, samplings, weight_version=version, tokenizer=self.tokenizer)

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> int:
        """Load new policy weights into the engine, flush its prefix cache, and bump ``weight_version``.

        Tensor path: ``begin_weight_update()`` (when the engine has it), ``update_weights_from_tensor`` per
        bucket with ``flush_cache=False``, ``end_weight_update()``, then one ``flush_cache()``. Disk path:
        write a safetensors checkpoint to a temporary folder and ``update_weights_from_disk`` it. LoRA group
        (``lora_name`` set): ``named_tensors`` are the adapter's only; they are written as a PEFT folder
        ``adapter_dir/<lora_name>-v<N>`` and SGLang's ``unload_lora_adapter(lora_name)`` +
        ``load_lora_adapter(lora_name, lora_path)`` swap it in; no base weight is sent.

        Returns:
            The new ``weight_version``.

        Raises:
            RuntimeError: SGLang reported ``success=False`` for any call (the message is included), or the
                backend is asleep/closed. The version is not bumped then.
        """
        self._check_usable()
        items = named_tensor_list(named_tensors)
        if self.lora_name is not None:
            self._push_adapter(items, self.weight_version + 1)
        elif self.weight_sync == "tensor":
            self._update_from_tensor(items)
        else:
            self._update_from_disk(items)
        self._flush_cache()
        self.weight_version += 1
        return self.weight_version

    def _update_from_tensor(self, items: list[tuple[str, torch.Tensor]]) -> None:
        if self.has_update_session:
            check_result(self.engine.begin_weight_update(), "begin_weight_update")
        try:
            for bucket in weight_buckets(items, self.bucket_bytes):
                if self.tensor_device is not None:
                    bucket = [(n, t.detach().to(self.tensor_device)) for n, t in bucket]
                check_result(
                    self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False),
                    "update_weights_from_tensor",
                )
        finally:
            if self.has_update_session:
                check_result(self.engine.end_weight_update(), "end_weight_update")

    def _update_from_disk(self, items: list[tuple[str, torch.Tensor]]) -> None:
        with tempfile.TemporaryDirectory(prefix="mas_sglang_weights_") as tmp:
            write_hf_checkpoint(items, tmp, model_config=self.model_config, source_dir=self.model_path)
            check_result(self.engine.update_weights_from_disk(model_path=tmp), "update_weights_from_disk")

    def _load_lora(self, name: str, path: str) -> None:
        check_result(self.engine.load_lora_adapter(lora_name=name, lora_path=path), "load_lora_adapter")

    def _unload_lora(self, name: str) -> None:
        check_result(self.engine.unload_lora_adapter(lora_name=name), "unload_lora_adapter")

    def _flush_cache(self) -> None:
        # flush_cache refuses while requests are in flight; generate() is synchronous, so retry only briefly
        for attempt in range(3):
            ok, message = result_ok(self.engine.flush_cache())
            if ok:
                return
            time.sleep(0.1 * (attempt + 1))
        raise RuntimeError(f"SGLang flush_cache failed after a weight update: {message}")

    def sleep(self) -> None:
        """Release weights and KV cache (``release_memory_occupation``); a no-op without the memory saver."""
        if self._closed or self._asleep or not self.enable_memory_saver:
            return
        check_result(self.engine.release_memory_occupation(), "release_memory_occupation")
        self._asleep = True

    def wake(self) -> None:
        """Re-occupy the memory released by :meth:`sleep` (``resume_memory_occupation``)."""
        if self._closed or not self._asleep:
            return
        check_result(self.engine.resume_memory_occupation(), "resume_memory_occupation")
        self._asleep = False

    def close(self) -> None:
        """Shut the engine down (only if this backend built it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_engine and hasattr(self.engine, "shutdown"):
            self.engine.shutdown()
        if self._tmp_adapter_dir is not None:
            shutil.rmtree(self._tmp_adapter_dir, ignore_errors=True)

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("this SGLang backend is closed")
        if self._asleep:
            raise RuntimeError("this SGLang backend is asleep (memory released); call wake() first")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
