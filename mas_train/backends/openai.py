"""``openai`` backend: a frozen agent on an OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp, hosted APIs).

The agent's turns go through the official ``openai`` client to ``/chat/completions`` (default: the server
applies its own chat template to the env's messages) or ``/completions`` (the prompt ids the collector
rendered with the group's tokenizer, decoded back to text). Its text goes to the env like any agent's; its
turns are never trained on: a remote server gives no token ids or sampling logprobs of *our* policy, so the
returned ``completion_ids`` are the local tokenizer's encoding of the reply text (for logging and lengths
only), ``logprobs`` are zeros, ``meta["trainable"]`` is ``False`` and :attr:`OpenAIBackend.can_train` is
``False``.

Reliability rules:

* ``timeout_s`` bounds each whole attempt (connect, send, the full reply: the client's transport is
  :class:`retrieval_index.deadline_http.DeadlineTransport`, so a server that trickles its reply cannot stretch it).
  Retries are the client's own: up to ``max_retries`` on connection errors, timeouts, 408/409/429 and 5xx, with
  exponential backoff (0.5 s doubling to 8 s, 0-25 % jitter) or the server's ``Retry-After`` / ``retry-after-ms``.
* A server that is still unreachable, timing out or failing after the retries, or that rejects the request
  (401 key, 404 model/route, 400 a parameter), raises :class:`OpenAIBackendError` naming ``base_url``: that is
  a configuration problem, not something to train through.
* A reply that arrives but is malformed (not JSON, no ``choices``, no text content) becomes an empty
  completion (``meta["error"]`` says why), counted in ``usage["errors"]`` and logged as a warning. Every env
  treats the empty action as an invalid action, so the run goes on and the failure shows in the metrics.

The API key is read from the environment variable named by ``OpenAIOptions.api_key_env`` (unset:
``OPENAI_API_KEY`` for ``https://api.openai.com`` only, no key for any other server) when the backend is built
and handed to the client only, which sends it as ``Authorization: Bearer`` to ``base_url`` (httpx drops the
header on a redirect to another host); a key going over plain ``http://`` to a host other than loopback is
warned about once per backend. It is not in the options, the backend's repr, any error or log message of this
module (server messages are scrubbed of it), and the backend refuses to be pickled.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

from mas_train.backends.base import FinishReason, GenerationOutput, SamplingParams
from mas_train.backends.endpoint_keys import key_env_for, private_transport
from mas_train.backends.options import OpenAIOptions

__all__ = ["OpenAIBackend", "OpenAIBackendError", "OpenAIOptions"]

log = logging.getLogger(__name__)

ENDPOINTS = ("chat", "completions")


class OpenAIBackendError(RuntimeError):
    """The endpoint cannot serve this run (unreachable, timing out, failing or rejecting requests)."""


class _Malformed(Exception):
    """A reply arrived but cannot be read as a completion."""


def _count(usage: Any, name: str) -> int:
    """A token count from a reply's ``usage``; 0 when the server sends none or garbage (only logged)."""
    try:
        return max(int(getattr(usage, name, 0) or 0), 0)
    except (TypeError, ValueError):
        return 0


class OpenAIBackend:
    """A frozen agent behind an OpenAI-compatible endpoint; implements :class:`GenerationBackend`.

    Args:
        options: :class:`OpenAIOptions`.
        tokenizer: the model group's tokenizer: decodes prompt ids for ``/completions`` and encodes reply text
            into ``completion_ids`` (so lengths are comparable with the trained agents').

    Raises:
        ValueError: ``options.api_key_env`` names an environment variable that is unset or empty.
        ImportError: the ``openai`` package is missing (``pip install 'mas-rl[openai]'``).

    Attributes:
        can_train: always ``False``: its samples must never reach a loss.
        wants_messages: ``True`` for the chat endpoint: the collector should call :meth:`generate_messages`
            with the env's chat messages instead of :meth:`generate` with rendered prompt ids.
        weight_version: always 0 (frozen).
    """

    can_train = False

    def __init__(self, options: OpenAIOptions, tokenizer: PreTrainedTokenizerBase) -> None:
        try:
            import openai
        except ImportError as err:
            raise ImportError(
                f"the openai backend needs the openai client: pip install 'mas-rl[openai]' ({err})"
            ) from err
        self.options = options
        self.tokenizer = tokenizer
        self.weight_version = 0
        key: str | None = None
        key_env = key_env_for(options)
        if key_env is not None:
            key = os.environ.get(key_env) or None
            if key is None and options.api_key_env is not None:
                raise ValueError(
                    f"openai backend for {options.base_url}: environment variable {options.api_key_env!r} "
                    "(api_key_env) is unset or empty; export the API key there, or set api_key_env to null "
                    "for a server without authentication"
                )
        # Without a key the Authorization header is omitted explicitly. The placeholder only satisfies the
        # client's credential check: given no api_key it would pick up OPENAI_API_KEY from the environment and
        # send it to whatever server base_url names.
        if key is not None and not private_transport(options.base_url):
            log.warning(
                "openai backend: the API key from $%s goes to %s over plain http, readable on the network; "
                "use https:// for a server beyond this machine",
                key_env,
                options.base_url,
            )
        from retrieval_index.deadline_http import deadline_client

        self._client = openai.OpenAI(
            api_key=key or "no-key",
            base_url=options.base_url,
            timeout=float(options.timeout_s),
            max_retries=int(options.max_retries),
            http_client=deadline_client(float(options.timeout_s)),
        )
        # the client only accepts an omitted Authorization header per request
        self._extra_headers = None if key else {"Authorization": openai.omit}
        self._has_key = key is not None
        self._pool = ThreadPoolExecutor(
            max_workers=options.max_concurrency, thread_name_prefix="openai-backend"
        )
        self._lock = threading.Lock()
        self._usage = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "retries": 0, "errors": 0}
        self._closed = False

    @property
    def wants_messages(self) -> bool:
        """Whether the collector must pass chat messages (:meth:`generate_messages`): the chat endpoint."""
        return self.options.endpoint == "chat"

    @property
    def usage(self) -> dict[str, int]:
        """Totals since the backend was built, for the trainer to log: ``requests`` (answered requests),
        ``prompt_tokens`` and ``completion_tokens`` (as the server counts them in ``usage``; 0 where it sends
        none), ``retries`` (extra attempts the client made) and ``errors`` (malformed replies)."""
        with self._lock:
            return dict(self._usage)

    def __repr__(self) -> str:
        o = self.options
        return (
            f"OpenAIBackend(base_url={o.base_url!r}, model={o.model!r}, endpoint={o.endpoint!r}, "
            f"api_key_env={o.api_key_env!r})"
        )

    __str__ = __repr__

    def __getstate__(self) -> None:
        # The client holds the API key; a pickled backend (checkpoint, Ray object store) would carry it.
        raise TypeError(
            "OpenAIBackend cannot be pickled (it holds a live client); build one where it is used"
        )

    # -- GenerationBackend ---------------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams],
    ) -> list[GenerationOutput]:
        """Complete rendered prompts through ``/completions`` (the prompt ids are decoded to text as is,
        special tokens included, so the server must not add its own chat template).

        Args:
            prompt_ids: N prompts as token ids of the group's tokenizer.
            sampling: one :class:`SamplingParams` for all, or N of them.

        Returns:
            N :class:`GenerationOutput` in prompt order (see :meth:`generate_messages` for their fields).

        Raises:
            ValueError: ``endpoint="chat"`` (use :meth:`generate_messages`), an empty prompt, or
                ``len(sampling) != N``.
            OpenAIBackendError: the endpoint is unreachable, times out, fails or rejects a request after the
                client's retries. RuntimeError: the backend is closed.
        """
        if self.options.endpoint != "completions":
            raise ValueError(
                f"openai backend for {self.options.base_url} uses endpoint='chat', which takes chat "
                "messages: call generate_messages(messages, sampling), or set endpoint='completions' to send "
                "rendered prompt ids"
            )
        prompts = [list(map(int, p)) for p in prompt_ids]
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        texts = [self.tokenizer.decode(p, skip_special_tokens=False) for p in prompts]
        return self._run(texts, self._params(sampling, len(texts)))

    def generate_messages(
        self,
        messages: Sequence[Sequence[Mapping[str, Any]]],
        sampling: SamplingParams | Sequence[SamplingParams],
    ) -> list[GenerationOutput]:
        """Answer N chat conversations through ``/chat/completions`` (the server applies its chat template).

        Args:
            messages: N conversations, each a list of ``{"role": ..., "content": ...}`` dicts (the env's
                ``infos[agent]["messages"]``).
            sampling: one :class:`SamplingParams` for all, or N of them. ``max_new_tokens`` is sent as
                ``max_tokens``, ``top_k > 0`` as the vLLM/SGLang extension ``top_k`` (a server without it
                rejects the request), ``seed`` and ``stop`` as themselves.

        Returns:
            N :class:`GenerationOutput` in order: ``completion_ids`` the local tokenizer's encoding of the
            reply text (``add_special_tokens=False``; its length may exceed ``max_new_tokens``, which the
            *server's* tokenizer counts), ``logprobs`` zeros, ``finish_reason`` ``"length"`` when the server
            says so, else ``"stop"``, ``stop_string`` the stop string that ended it, kept at the end of the
            text as other backends do; ``meta`` holds ``env_text`` (the exact text for the env: the local
            ids need not decode back to it), ``trainable: False``, ``server_finish_reason`` and, for a
            malformed reply, ``error``.

        Raises:
            ValueError: ``endpoint="completions"`` (use :meth:`generate`), or ``len(sampling) != N``.
            OpenAIBackendError: as in :meth:`generate`.
            RuntimeError: the backend is closed.
        """
        if self.options.endpoint != "chat":
            raise ValueError(
                f"openai backend for {self.options.base_url} uses endpoint='completions', which takes prompt "
                "ids: call generate(prompt_ids, sampling), or set endpoint='chat'"
            )
        convs = [[dict(m) for m in conv] for conv in messages]
        return self._run(convs, self._params(sampling, len(convs)))

    def update_weights(
        self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> int:
        """Always raises: the endpoint's weights are not ours to change.

        Raises:
            RuntimeError: always (a frozen agent has no weight sync; mark its agent or group
                ``trainable: false``).
        """
        raise RuntimeError(
            f"openai backend for {self.options.base_url} serves a frozen agent: it has no weight sync. "
            "Agents on an openai backend must be trainable: false."
        )

    def sleep(self) -> None:
        """No-op: the endpoint's memory is not ours."""

    def wake(self) -> None:
        """No-op."""

    def close(self) -> None:
        """Stop the worker threads and close the client's connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    # -- internals -----------------------------------------------------------------------------------------

    @staticmethod
    def _params(sampling: SamplingParams | Sequence[SamplingParams], n: int) -> list[SamplingParams]:
        if isinstance(sampling, SamplingParams):
            return [sampling] * n
        params = list(sampling)
        if len(params) != n:
            raise ValueError(f"got {len(params)} SamplingParams for {n} prompts; pass one or one per prompt")
        return params

    def _run(self, payloads: list[Any], params: list[SamplingParams]) -> list[GenerationOutput]:
        if self._closed:
            raise RuntimeError("OpenAIBackend is closed; create a new backend")
        # The pool has max_concurrency threads, so at most that many requests are in flight.
        futures = [self._pool.submit(self._one, p, sp) for p, sp in zip(payloads, params, strict=True)]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    def _scrub(self, text: str) -> str:
        if self._has_key and self._client.api_key:
            text = text.replace(self._client.api_key, "***")
        return text

    def _fail(self, what: str) -> OpenAIBackendError:
        o = self.options
        return OpenAIBackendError(self._scrub(f"openai backend {o.base_url} (model {o.model!r}): {what}"))

    def _request(self, payload: Any, sp: SamplingParams) -> tuple[Any, int]:
        import openai

        o = self.options
        kwargs: dict[str, Any] = {
            "model": o.model,
            "max_tokens": sp.max_new_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "n": 1,
            "extra_headers": self._extra_headers,
        }
        if sp.stop:
            kwargs["stop"] = list(sp.stop)
        if sp.seed is not None:
            kwargs["seed"] = sp.seed
        if sp.top_k > 0:
            kwargs["extra_body"] = {"top_k": sp.top_k}
        failure = None
        try:
            if o.endpoint == "chat":
                raw = self._client.chat.completions.with_raw_response.create(messages=payload, **kwargs)
            else:
                raw = self._client.completions.with_raw_response.create(prompt=payload, **kwargs)
        except openai.APITimeoutError:
            failure = (
                f"no reply within timeout_s={o.timeout_s} after {o.max_retries} retries; is the server "
                "overloaded? raise timeout_s or lower max_concurrency"
            )
        except openai.APIConnectionError as err:
            failure = (
                f"cannot connect after {o.max_retries} retries ({type(err.__cause__ or err).__name__}); "
                "is the server running at base_url?"
            )
        except openai.APIStatusError as err:
            status = err.status_code
            hint = {
                401: f"the API key from ${key_env_for(o)} was rejected",
                403: f"the API key from ${key_env_for(o)} may not use this model",
                404: "no such model or route: check model and that base_url ends with /v1",
                429: "rate limited: lower max_concurrency or raise max_retries",
            }.get(status, "the request was refused" if status < 500 else "server error")
            if status in (408, 409, 429) or status >= 500:  # the statuses the client retries
                hint += f" (after {o.max_retries} retries)"
            failure = f"HTTP {status}, {hint}: {err.message}"
        if failure is not None:
            # Raised outside the handler, so the client's exception (its text quotes the server's reply, which
            # may echo the key) is not chained as __context__; the message is scrubbed.
            raise self._fail(failure)
        try:
            return raw.parse(), int(getattr(raw, "retries_taken", 0))
        except ValueError as err:  # a JSON content-type with a body that is not JSON (JSONDecodeError)
            raise _Malformed(f"reply is not valid JSON ({err})") from None
        except TypeError as err:  # JSON the client cannot even loosely build a completion from
            raise _Malformed(f"reply has an unexpected shape ({err})") from None

    def _one(self, payload: Any, sp: SamplingParams) -> GenerationOutput:
        try:
            resp, retries = self._request(payload, sp)
            text, server_finish, reported_stop, usage = self._read(resp)
        except _Malformed as err:
            msg = self._scrub(str(err))
            log.warning(
                "openai backend %s: malformed reply, used an empty completion: %s", self.options.base_url, msg
            )
            with self._lock:
                self._usage["errors"] += 1
            return GenerationOutput(
                [], [], "stop", self.weight_version, meta={"trainable": False, "env_text": "", "error": msg}
            )
        finish: FinishReason = "length" if server_finish == "length" else "stop"
        text, stop_string, finished_by_stop = self._apply_stops(text, sp.stop, server_finish, reported_stop)
        if finished_by_stop:
            finish = "stop"
        ids = [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)] if text else []
        with self._lock:
            self._usage["requests"] += 1
            self._usage["retries"] += retries
            self._usage["prompt_tokens"] += usage[0]
            self._usage["completion_tokens"] += usage[1]
        return GenerationOutput(
            completion_ids=ids,
            logprobs=[0.0] * len(ids),
            finish_reason=finish,
            weight_version=self.weight_version,
            stop_string=stop_string,
            meta={"trainable": False, "env_text": text, "server_finish_reason": server_finish},
        )

    def _read(self, resp: Any) -> tuple[str, str | None, Any, tuple[int, int]]:
        """(text, server finish_reason, the stop the server says matched, (prompt, completion) tokens)."""
        try:
            return self._read_fields(resp)
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as err:
            # the client builds replies without validation, so any JSON arrives here in some shape
            raise _Malformed(f"reply has an unexpected shape ({type(err).__name__}: {err})") from None

    def _read_fields(self, resp: Any) -> tuple[str, str | None, Any, tuple[int, int]]:
        if isinstance(resp, str):  # the client returns the body as text when it is not declared JSON
            raise _Malformed(f"reply is not JSON: {resp[:200]!r}")
        choices = getattr(resp, "choices", None)
        if not choices:
            raise _Malformed("reply has no choices")
        choice = choices[0]
        if self.options.endpoint == "chat":
            text = getattr(getattr(choice, "message", None), "content", None)
        else:
            text = getattr(choice, "text", None)
        if not isinstance(text, str):
            raise _Malformed(f"reply has no text content (got {type(text).__name__})")
        extra = getattr(choice, "model_extra", None) or {}
        # vLLM reports the matched stop string as stop_reason, SGLang as matched_stop; OpenAI reports none
        reported = extra.get("stop_reason", extra.get("matched_stop"))
        usage = getattr(resp, "usage", None)
        counts = (_count(usage, "prompt_tokens"), _count(usage, "completion_tokens"))
        finish = getattr(choice, "finish_reason", None)
        return text, (str(finish) if finish is not None else None), reported, counts

    @staticmethod
    def _apply_stops(
        text: str, stops: tuple[str, ...], server_finish: str | None, reported: Any
    ) -> tuple[str, str | None, bool]:
        """Apply the protocol's stop rule to a server's reply: ``(text, stop_string, ended_by_stop)``.

        The protocol keeps the stop string at the end of the completion; OpenAI-style servers cut it off. So:

        1. a stop string inside the text (a server that ignored ``stop`` or returns it): cut right after the
           one completed first (earliest end), as a local decode loop would have stopped there;
        2. else, when the server stopped and names the stop string it matched (vLLM, SGLang): append it;
        3. else, when the server stopped without saying why (OpenAI) and a closing-tag stop ``</x>`` has its
           opening tag ``<x>`` open at the end of the text: append it (an open ``<verify>`` can only have been
           closed by ``</verify>``); otherwise the reply ended on the model's own end-of-turn.
        """
        if not stops:
            return text, None, False
        hits = [(text.find(s), s) for s in stops if s in text]
        if hits:
            at, stop = min(hits, key=lambda h: (h[0] + len(h[1]), h[0]))
            return text[: at + len(stop)], stop, True
        if server_finish != "stop":
            return text, None, False
        if isinstance(reported, str) and reported in stops:
            return text + reported, reported, True
        for stop in stops:
            if stop.startswith("</") and stop.endswith(">") and len(stop) > 3:
                opening = "<" + stop[2:]
                if opening in text:
                    return text + stop, stop, True
        return text, None, False
