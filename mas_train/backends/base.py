"""The generation-backend contract: token ids in, token ids + sampling logprobs out.

Every backend (Hugging Face ``generate`` on CPU, an in-process SGLang engine, an SGLang or vLLM HTTP server, a
Ray actor wrapping any of these) implements :class:`GenerationBackend`. The trainer and the rollout collector only
ever talk to this protocol, so a new backend slots in without touching them.

Token ids are the single source of truth: the ids a backend returns are the ids the trainer trains on. Text is
decoded for the environment only; it is never re-tokenised to rebuild a training sequence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import Field, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # torch is only needed by implementations, never to import this module
    import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    Attributes:
        max_new_tokens: cap on generated tokens (the completion may be shorter).
        temperature: softmax temperature; ``0`` means greedy. Logprobs are ``log_softmax(logits / temperature)``
            of the sampled token (greedy: temperature 1): the tempered distribution before top-p/top-k
            truncation, which is what SGLang returns and what the trainer recomputes. With ``top_p=1`` and
            ``top_k=0`` it is exactly the distribution sampled from. (``vllm_http`` with vLLM's
            ``processed_logprobs`` reports the truncated, renormalised distribution's: the same when both are off.)
        top_p: nucleus sampling mass in (0, 1]; ``1.0`` disables it.
        top_k: keep the k most likely tokens; ``0`` (or ``-1``) disables it.
        stop: stop strings. Generation ends as soon as the decoded completion contains one of them; the
            completion keeps the stop string (e.g. ends with ``</search>``) and nothing after the token that
            completed it.
        seed: optional per-request seed for reproducible sampling.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


FinishReason = Literal["stop", "length"]


@dataclass
class GenerationOutput:
    """One completion.

    Attributes:
        completion_ids: generated token ids, ``list[int]`` of length T (EOS included when it was generated).
        logprobs: sampling logprob of each generated token, ``list[float]`` of length T, aligned 1:1 with
            ``completion_ids`` (natural log, float32 precision).
        finish_reason: ``"stop"`` (EOS or a stop string) or ``"length"`` (hit ``max_new_tokens``).
        weight_version: the backend's ``weight_version`` when this completion was sampled; the trainer
            refuses samples whose version is older than the policy it updates (stale samples).
        stop_string: the stop string that ended generation, if any.
    """

    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int
    stop_string: str | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError(
                f"logprobs must align with completion_ids: {len(self.logprobs)} != {len(self.completion_ids)}"
            )


@runtime_checkable
class GenerationBackend(Protocol):
    """What the rollout collector and trainer need from a generator.

    ``weight_version`` starts at 0 and increases by one on every successful :meth:`update_weights`.
    """

    weight_version: int

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams],
    ) -> list[GenerationOutput]:
        """Sample one completion per prompt.

        Args:
            prompt_ids: N prompts as token ids (no padding; the backend pads as it needs).
            sampling: one :class:`SamplingParams` for all prompts, or N of them (one per prompt; agents that
                share a model group may sample differently).

        Returns:
            N :class:`GenerationOutput`, in prompt order.
        """
        ...

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> int:
        """Load new policy weights (names as in the trainer model's ``state_dict``); returns the new version.

        Raises:
            RuntimeError: when the backend reports that the update failed.
        """
        ...

    def sleep(self) -> None:
        """Free accelerator memory (weights and KV cache) while the trainer updates; no-op where pointless."""
        ...

    def wake(self) -> None:
        """Undo :meth:`sleep`."""
        ...

    def close(self) -> None:
        """Release every resource (processes, sockets, memory). Idempotent."""
        ...


@runtime_checkable
class ChatBackend(Protocol):
    """An optional capability of a backend: it takes chat messages instead of token ids (a chat endpoint that
    applies its own template, e.g. :class:`~mas_train.backends.openai.OpenAIBackend` on ``/chat/completions``).
    The rollout collector calls :meth:`generate_messages` when :attr:`wants_messages` is true."""

    @property
    def wants_messages(self) -> bool: ...

    def generate_messages(
        self,
        messages: Sequence[Sequence[Mapping[str, str]]],
        sampling: SamplingParams | Sequence[SamplingParams],
    ) -> list[GenerationOutput]:
        """One completion per conversation (N lists of ``{"role", "content"}`` messages), in order."""
        ...


@runtime_checkable
class LogprobScorer(Protocol):
    """An optional capability of a backend or worker: the log-probabilities of *given* completions (teacher
    forcing), e.g. for an env's exact evaluation (:meth:`mas_envs.core.TextAECEnv.exact_evaluation`). Checked
    with ``isinstance`` and :attr:`can_score` (a worker has the method whatever its backend is)."""

    @property
    def can_score(self) -> bool: ...

    def score(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Per-token ``log_softmax(logits)[token]`` (temperature 1, no truncation; natural log) of each
        completion after its prompt: N lists aligned with ``completion_ids``, in order."""
        ...


@runtime_checkable
class UsageReporter(Protocol):
    """An optional capability of a backend: request and token counters (remote endpoints), logged per step as
    ``charts/backend/<counter>/<group>``."""

    @property
    def usage(self) -> Mapping[str, float]: ...


class BackendOptions(Protocol):
    """The options of any backend kind: an instance of the dataclass registered for the kind
    (:func:`mas_train.backends.register_backend`); the built-in ones are in :mod:`mas_train.backends.options`.
    Code that reads a kind's own fields narrows with ``isinstance`` first."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]


class Generator(Protocol):
    """What the collector needs of a model group: the backend ``generate`` signature (a backend, a
    :class:`~mas_train.hosting.worker.ModelGroupWorker`, a Ray handle). Two optional capabilities are declared
    as protocols of their own and checked with ``isinstance``: :class:`MixedBatchGenerator` (several groups'
    adapters in one call) and :class:`~mas_train.backends.base.ChatBackend` (chat messages instead of ids)."""

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams | Sequence[SamplingParams]
    ) -> list[GenerationOutput]: ...


@runtime_checkable
class MixedBatchGenerator(Generator, Protocol):
    """A generator whose rows can share one batched call with other groups' generators of the same
    :attr:`mixed_batch_key` (LoRA adapters of several groups on one base model; ``None``: it generates alone)."""

    @property
    def mixed_batch_key(self) -> int | None: ...

    def generate_mixed(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams],
        workers: Sequence[Any],
    ) -> list[GenerationOutput]:
        """Row i sampled with ``workers[i]``'s weights (all of this generator's :attr:`mixed_batch_key`)."""
        ...
