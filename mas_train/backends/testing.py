"""The contract every :class:`~mas_train.backends.base.GenerationBackend` must pass, as a reusable pytest class.

Shipped in the package (as :mod:`mas_envs.testing` is for envs) so that a third-party backend runs the same
checks as ours. Subclass :class:`BackendContract` in a ``test_*.py`` file and override two fixtures:

* ``reference_model_and_tokenizer``: ``(model, tokenizer)``, a small Hugging Face causal LM on CPU and its
  tokenizer (our own tests reuse their session's tiny Qwen3; yours may load any local model folder);
* ``make_backend``: a factory returning a *fresh* backend (weight_version 0) that serves exactly those weights::

    import pytest
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mas_train.backends.testing import BackendContract

    class TestMyBackend(BackendContract):
        @pytest.fixture(scope="class")
        def reference_model_and_tokenizer(self):
            path = "path/to/a/tiny/model"
            return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)

        @pytest.fixture
        def make_backend(self, reference_model_and_tokenizer):
            model, tok = reference_model_and_tokenizer
            made = []
            def factory():
                made.append(MyBackend(model, tokenizer=tok))
                return made[-1]
            yield factory
            for b in made:
                b.close()

Run it with ``pytest``; it needs ``torch`` and ``pytest`` (the test extra).

Every check is made against the reference Hugging Face model itself: greedy tokens against a plain
full-sequence argmax loop, sampling logprobs against a teacher-forced forward pass of prompt + completion
(``log_softmax(logits / T)``, fp32, tolerance :attr:`BackendContract.logprob_atol`), weight updates against the
reference model with the same tensors loaded. So the backend must really run that model; a backend that
cannot (a remote server with other weights) needs its own tests.

Class attributes a subclass may change:
    logprob_atol: tolerance of the logprob comparisons (1e-3 suits fp32 on CPU; bf16 on GPU needs ~5e-2).
    seeds_batch_invariant: whether a per-request seed gives the same completion whatever else is batched
        with it (True for HFBackend; SGLang only promises this with deterministic inference).
    logprobs_truncated: the backend's logprobs are those of the distribution after top-k/top-p truncation
        (renormalised), not of the tempered softmax before it (False for HFBackend and SGLang; True for vLLM's
        ``processed_logprobs``). The two agree when ``top_k`` and ``top_p`` are off.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from mas_train.backends.base import GenerationBackend, GenerationOutput, SamplingParams

__all__ = [
    "BackendContract",
    "chat_prompt",
    "collapse_to_eos",
    "perturbed_state",
    "reference_greedy",
    "stop_string_completed_inside",
    "teacher_forced_logprobs",
    "truncate_logits",
]


# -- helpers (public: other backend tests may use them) -----------------------------------------------------


def chat_prompt(tokenizer, content: str) -> list[int]:
    """Render one user turn with the chat template and tokenise it (ids, no extra special tokens)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


def truncate_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """``logits`` (..., V) with the tokens top-k / top-p sampling drops set to ``-inf``.

    Top-k keeps the ``k`` largest logits (ties at the k-th kept); top-p then keeps the most likely tokens whose
    probabilities sum to at least ``p`` (always at least one), as vLLM's ``apply_top_k_top_p`` does.
    """
    if top_k and top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1)  # ascending
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= 1.0 - top_p
        drop[..., -1] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


@torch.no_grad()
def teacher_forced_logprobs(
    model, prompt: list[int], completion: list[int], temperature: float, top_k: int = 0, top_p: float = 1.0
) -> list[float]:
    """``log_softmax(logits / T)`` of each completion token given everything before it; one unpadded forward.

    ``T = 0`` (greedy) is scored at ``T = 1``, as the protocol defines. ``top_k`` / ``top_p`` (default off)
    score against the truncated, renormalised distribution instead (:func:`truncate_logits`), for backends
    whose logprobs are those of the distribution after truncation (vLLM's ``processed_logprobs``).
    """
    full = torch.tensor([prompt + completion], device=model.device)
    logits = model(full).logits[0, len(prompt) - 1 : -1].float()
    logits = logits / (temperature if temperature > 0 else 1.0)
    if temperature > 0:
        logits = truncate_logits(logits, top_k, top_p)
    target = torch.tensor(completion, device=logits.device)[:, None]
    return torch.log_softmax(logits, dim=-1).gather(1, target)[:, 0].tolist()


@torch.no_grad()
def reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens by re-running the full unpadded sequence each step (no KV cache, no batching)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids], device=model.device)).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def stop_string_completed_inside(tokenizer, ids: list[int]) -> tuple[str, int]:
    """A stop string from ``ids``' own text that token ``k+1`` completes in its middle; returns ``(stop, k)``.

    Picks the first ``k >= 2`` where the text of ``ids[:k]`` is a clean prefix (no partial UTF-8 character)
    of the text of ``ids[:k+1]``, and the stop string (last 3 characters of ``ids[:k]`` + first character of
    token ``k+1``) does not occur earlier.
    """
    for k in range(2, len(ids) - 1):
        before, after = tokenizer.decode(ids[:k]), tokenizer.decode(ids[: k + 1])
        if len(before) < 3 or not after.startswith(before) or len(after) < len(before) + 2:
            continue
        stop = before[-3:] + after[len(before)]
        if "\ufffd" not in stop and stop not in before:
            return stop, k
    raise AssertionError("test precondition: no usable stop string in the greedy text")


def _embedding_names(model) -> tuple[str, str]:
    """State-dict names of the input and output embedding matrices (found by identity, any architecture)."""
    inp, out = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    names = {id(t): n for n, t in model.state_dict(keep_vars=True).items()}
    return names[id(inp)], names[id(out)]


@torch.no_grad()
def collapse_to_eos(model, eos_id: int) -> dict[str, torch.Tensor]:
    """Tensors that make ``model`` emit ``eos_id`` with probability ~1 at every step, whatever the prompt.

    Every token gets the same input embedding, so every position carries the same hidden state ``h`` (attention
    over identical values returns that value; all other layers act per position). The output-embedding row of
    EOS is then set to ``1000 h / |h|^2``: its logit is 1000, the others stay O(1). Needs untied embeddings.
    """
    emb_name, head_name = _embedding_names(model)
    if emb_name == head_name:
        raise ValueError("collapse_to_eos needs a model with untied input/output embeddings")
    state = model.state_dict()
    emb = state[emb_name].clone()
    emb[:] = emb[0]
    probe = copy.deepcopy(model)
    probe.get_input_embeddings().weight.copy_(emb)
    captured: dict[str, torch.Tensor] = {}  # the LM head's input is the final (normed) hidden state
    handle = probe.get_output_embeddings().register_forward_hook(
        lambda mod, args, out: captured.setdefault("h", args[0])
    )
    probe(torch.tensor([[0]], device=model.device))
    handle.remove()
    h = captured["h"][0, -1].float()
    head = state[head_name].clone()
    head[eos_id] = (1000.0 * h / h.dot(h)).to(head.dtype)
    return {emb_name: emb, head_name: head}


@torch.no_grad()
def perturbed_state(model, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every floating tensor plus N(0, 0.05^2) noise, and the output embedding negated (greedy text changes)."""
    gen = torch.Generator().manual_seed(seed)
    _, head_name = _embedding_names(model)
    out = {}
    for name, t in model.state_dict().items():
        if not t.is_floating_point():
            continue
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.device, t.dtype)
        out[name] = t + 0.05 * noise
    out[head_name] = -model.state_dict()[head_name]
    return out


def _model_with(model, tensors: dict[str, torch.Tensor]):
    twin = copy.deepcopy(model)
    twin.load_state_dict(tensors, strict=False)
    return twin


# -- the contract -------------------------------------------------------------------------------------------


class BackendContract:
    """Contract tests; subclasses override the ``make_backend`` fixture (see the module docstring)."""

    logprob_atol: float = 1e-3
    seeds_batch_invariant: bool = True
    logprobs_truncated: bool = False

    @pytest.fixture
    def make_backend(self):
        raise NotImplementedError("override the make_backend fixture: a factory returning a fresh backend")

    @pytest.fixture
    def reference_model_and_tokenizer(self, tiny_model_and_tokenizer):
        return tiny_model_and_tokenizer

    @pytest.fixture
    def backend(self, make_backend):
        return make_backend()

    @pytest.fixture
    def prompts(self, reference_model_and_tokenizer) -> list[list[int]]:
        """Four prompts of different lengths (left padding matters), one with non-ASCII text."""
        _, tok = reference_model_and_tokenizer
        return [
            chat_prompt(tok, "What is 2 + 3?"),
            chat_prompt(tok, "Solve for x: 3x + 7 = 22. Think step by step, then answer."),
            chat_prompt(tok, "Überprüfe: 12 × 12 = 144? 答案"),
            tok.encode("Hi", add_special_tokens=False),
        ]

    def _check_logprobs(
        self, model, prompt, out: GenerationOutput, temperature: float, sampling: SamplingParams | None = None
    ) -> None:
        assert len(out.logprobs) == len(out.completion_ids)
        assert all(isinstance(lp, float) and math.isfinite(lp) and lp <= 1e-6 for lp in out.logprobs)
        trunc = {}
        if getattr(self, "logprobs_truncated", False) and sampling is not None:
            trunc = {"top_k": sampling.top_k, "top_p": sampling.top_p}
        expected = teacher_forced_logprobs(model, prompt, out.completion_ids, temperature, **trunc)
        diff = max(abs(a - b) for a, b in zip(out.logprobs, expected, strict=True))
        assert diff <= self.logprob_atol, f"sampling logprobs differ from teacher forcing by {diff:.2e}"

    # -- protocol surface ----------------------------------------------------------------------------------

    def test_implements_protocol(self, backend):
        assert isinstance(backend, GenerationBackend)
        assert backend.weight_version == 0

    def test_wrong_number_of_sampling_params_raises(self, backend, prompts):
        with pytest.raises(ValueError):
            backend.generate(prompts, [SamplingParams(max_new_tokens=2)] * (len(prompts) - 1))

    # -- token in, token out -------------------------------------------------------------------------------

    def test_greedy_round_trip_matches_reference_model(self, backend, prompts, reference_model_and_tokenizer):
        """Ids in, ids out, in prompt order: batched greedy equals an unbatched argmax loop on the prompt ids."""
        model, tok = reference_model_and_tokenizer
        n = 6
        outs = backend.generate(prompts, SamplingParams(max_new_tokens=n, temperature=0.0))
        assert len(outs) == len(prompts)
        for prompt, out in zip(prompts, outs, strict=True):
            ref = reference_greedy(model, prompt, n)
            assert not set(ref) & {tok.eos_token_id}, "test precondition: the reference must not hit EOS"
            assert out.completion_ids == ref
            assert all(type(t) is int for t in out.completion_ids)
            assert out.finish_reason == "length" and out.stop_string is None
            assert out.weight_version == 0
            # the ids decode to text the env sees; decoding is deterministic and loses nothing for these
            assert tok.decode(out.completion_ids) == tok.decode(ref)
            self._check_logprobs(model, prompt, out, 0.0)

    @pytest.mark.parametrize("temperature", [1.0, 0.7])
    def test_sampling_logprobs_match_teacher_forcing(
        self, backend, prompts, reference_model_and_tokenizer, temperature
    ):
        model, _ = reference_model_and_tokenizer
        outs = backend.generate(prompts, SamplingParams(max_new_tokens=12, temperature=temperature, seed=11))
        for prompt, out in zip(prompts, outs, strict=True):
            assert 1 <= len(out.completion_ids) <= 12
            self._check_logprobs(model, prompt, out, temperature)

    def test_top_k_1_is_greedy(self, backend, prompts, reference_model_and_tokenizer):
        """Truncation is applied when sampling; logprobs stay those of the untruncated tempered softmax (or, with
        ``logprobs_truncated``, are those of the one token left: 0)."""
        model, _ = reference_model_and_tokenizer
        sp = SamplingParams(max_new_tokens=5, temperature=1.0, top_k=1, seed=1)
        out = backend.generate(prompts[:2], sp)
        for prompt, o in zip(prompts[:2], out, strict=True):
            assert o.completion_ids == reference_greedy(model, prompt, 5)
            if getattr(self, "logprobs_truncated", False):  # one token left: probability 1
                self._check_logprobs(model, prompt, o, 1.0, sp)
                assert max(abs(lp) for lp in o.logprobs) < 1e-5
            else:
                self._check_logprobs(model, prompt, o, 1.0)

    def test_tiny_top_p_is_greedy(self, backend, prompts, reference_model_and_tokenizer):
        model, _ = reference_model_and_tokenizer
        out = backend.generate(
            prompts[:2], SamplingParams(max_new_tokens=5, temperature=1.0, top_p=1e-6, seed=1)
        )
        for prompt, o in zip(prompts[:2], out, strict=True):
            assert o.completion_ids == reference_greedy(model, prompt, 5)

    # -- stopping ------------------------------------------------------------------------------------------

    def test_stop_string_ends_generation_at_completing_token(
        self, backend, prompts, reference_model_and_tokenizer
    ):
        """A stop string that ends inside a token: the completion ends with that token and nothing after it.

        The stop string is cut from the model's own greedy text (a random model writes no ``</verify>`` on
        its own): the last 3 characters of the text of tokens 1..k plus the first character of token k+1, so
        token k+1 completes it. ``</verify>`` is passed too and must not fire.
        """
        model, tok = reference_model_and_tokenizer
        prompt = prompts[1]
        ref = reference_greedy(model, prompt, 10)
        stop, k = stop_string_completed_inside(tok, ref)
        out = backend.generate(
            [prompt], SamplingParams(max_new_tokens=10, temperature=0.0, stop=("</verify>", stop))
        )[0]
        assert out.completion_ids == ref[: k + 1]
        assert out.finish_reason == "stop"
        assert out.stop_string == stop
        text = tok.decode(out.completion_ids)
        assert stop in text and stop not in tok.decode(out.completion_ids[:-1])
        self._check_logprobs(model, prompt, out, 0.0)

    def test_stop_string_in_sampled_batch(self, backend, prompts, reference_model_and_tokenizer):
        """Each sampled row stops right after the token completing its first stop string, never later."""
        model, tok = reference_model_and_tokenizer
        sp = SamplingParams(max_new_tokens=24, temperature=1.0, stop=("e", "a"), seed=5)
        for prompt, out in zip(prompts, backend.generate(prompts, sp), strict=True):
            text = tok.decode(out.completion_ids)
            if out.finish_reason == "stop" and out.stop_string is not None:
                assert out.stop_string in text
                assert not any(s in tok.decode(out.completion_ids[:-1]) for s in sp.stop)
            else:  # EOS or length: no stop string anywhere
                assert not any(s in text for s in sp.stop)
            self._check_logprobs(model, prompt, out, 1.0)

    def test_eos_stops_and_is_kept(self, make_backend, prompts, reference_model_and_tokenizer):
        model, tok = reference_model_and_tokenizer
        backend = make_backend()
        tensors = collapse_to_eos(model, tok.eos_token_id)
        backend.update_weights(tensors)
        outs = backend.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))
        twin = _model_with(model, tensors)
        for prompt, out in zip(prompts, outs, strict=True):
            assert out.completion_ids == [tok.eos_token_id]
            assert out.finish_reason == "stop" and out.stop_string is None
            assert out.logprobs[0] > -1e-3
            self._check_logprobs(twin, prompt, out, 1.0)

    def test_length_finish(self, backend, prompts, reference_model_and_tokenizer):
        model, tok = reference_model_and_tokenizer
        outs = backend.generate(prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
        for out in outs:
            assert len(out.completion_ids) == 3 and out.finish_reason == "length"

    # -- determinism ---------------------------------------------------------------------------------------

    def test_greedy_is_deterministic(self, backend, prompts):
        sp = SamplingParams(max_new_tokens=8, temperature=0.0)
        a, b = backend.generate(prompts, sp), backend.generate(prompts, sp)
        assert [o.completion_ids for o in a] == [o.completion_ids for o in b]

    def test_per_request_seed_reproducible(self, backend, prompts):
        seeded = [
            SamplingParams(max_new_tokens=10, temperature=1.0, seed=100 + i) for i in range(len(prompts))
        ]
        a, b = backend.generate(prompts, seeded), backend.generate(prompts, seeded)
        assert [o.completion_ids for o in a] == [o.completion_ids for o in b]
        other = backend.generate(prompts[:1], SamplingParams(max_new_tokens=10, temperature=1.0, seed=999))
        assert other[0].completion_ids != a[0].completion_ids  # a near-uniform model: collision ~ 0

    def test_per_request_seed_independent_of_batch(self, backend, prompts):
        if not self.seeds_batch_invariant:
            pytest.skip("this backend does not promise batch-invariant seeded sampling")
        sp = SamplingParams(max_new_tokens=10, temperature=1.0, seed=42)
        alone = backend.generate([prompts[2]], sp)[0]
        batched = backend.generate(prompts, sp)[2]
        assert alone.completion_ids == batched.completion_ids

    def test_mixed_sampling_params_in_one_call(self, backend, prompts, reference_model_and_tokenizer):
        model, _ = reference_model_and_tokenizer
        params = [
            SamplingParams(max_new_tokens=4, temperature=0.0),
            SamplingParams(max_new_tokens=7, temperature=1.0, seed=3),
            SamplingParams(max_new_tokens=2, temperature=0.7, top_p=0.9, seed=4),
            SamplingParams(max_new_tokens=5, temperature=1.3, top_k=20, seed=5),
        ]
        outs = backend.generate(prompts, params)
        assert outs[0].completion_ids == reference_greedy(model, prompts[0], 4)
        for prompt, sp, out in zip(prompts, params, outs, strict=True):
            assert len(out.completion_ids) <= sp.max_new_tokens
            if out.finish_reason == "length":
                assert len(out.completion_ids) == sp.max_new_tokens
            if getattr(self, "logprobs_truncated", False):
                self._check_logprobs(model, prompt, out, sp.temperature, sp)
            else:
                self._check_logprobs(model, prompt, out, sp.temperature)
        # each row sampled as if alone
        alone = backend.generate([prompts[1]], params[1])[0]
        if self.seeds_batch_invariant:
            assert alone.completion_ids == outs[1].completion_ids

    # -- weights -------------------------------------------------------------------------------------------

    def test_update_weights_bumps_version_and_changes_samples(
        self, make_backend, prompts, reference_model_and_tokenizer
    ):
        model, _ = reference_model_and_tokenizer
        backend = make_backend()
        greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
        before = backend.generate(prompts, greedy)
        assert {o.weight_version for o in before} == {0}

        new = perturbed_state(model)
        assert backend.update_weights(new) == 1 and backend.weight_version == 1
        after = backend.generate(prompts, greedy)
        assert {o.weight_version for o in after} == {1}
        assert [o.completion_ids for o in after] != [o.completion_ids for o in before]
        twin = _model_with(model, new)  # the samples come from exactly the new weights
        for prompt, out in zip(prompts, after, strict=True):
            assert out.completion_ids == reference_greedy(twin, prompt, 6)
            self._check_logprobs(twin, prompt, out, 0.0)

        # an iterable of pairs works too, and restoring the weights restores the samples
        original = [(k, v) for k, v in model.state_dict().items() if k in new]
        assert backend.update_weights(iter(original)) == 2
        restored = backend.generate(prompts, greedy)
        assert [o.completion_ids for o in restored] == [o.completion_ids for o in before]
        assert {o.weight_version for o in restored} == {2}

    # -- lifecycle -----------------------------------------------------------------------------------------

    def test_sleep_wake_close(self, make_backend, prompts):
        backend = make_backend()
        backend.sleep()
        backend.wake()
        out = backend.generate(prompts[:1], SamplingParams(max_new_tokens=2, temperature=0.0))
        assert len(out) == 1 and len(out[0].completion_ids) == 2
        backend.close()
        backend.close()  # idempotent
