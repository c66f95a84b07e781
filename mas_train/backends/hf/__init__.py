"""The Hugging Face backend (``backend: hf``, the CPU default) and its CPU inference engine.

* :mod:`~mas_train.backends.hf.backend`: :class:`HFBackend`, batched sampling with a model in this process;
* :mod:`~mas_train.backends.hf.loop`: the decode loop of one batch (prefill with prompt sharing, finished-row
  dropping, per-row adapters), :class:`HFBackend`'s base class;
* :mod:`~mas_train.backends.hf.kernels`: oneDNN-packed linear layers, one-kernel RMSNorms, a preallocated cache;
* :mod:`~mas_train.backends.hf.decode`: the fused decode step of Llama-family models (LoRA adapters included);
* :mod:`~mas_train.backends.hf.sampling`: temperature / top-k / top-p sampling with its logprobs.
"""

from mas_train.backends.hf.backend import HFBackend

__all__ = ["HFBackend"]
