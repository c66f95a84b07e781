"""Small deterministic stand-ins for the rollout/trainer tests: a two-agent text env and a scripted generator.

``ScriptEnv``: the solver answers, the verifier approves or rejects; a rejection gives the solver another turn
(up to ``max_loops`` solver turns). R = 1 when the last solver answer contains the task's answer. A task row
may set ``"skip_verifier": True`` (the episode ends after the solver, so the verifier never acts) or
``"first_agent": "verifier"`` (the verifier acts first; unless it rejects, the episode ends there).
"""

from __future__ import annotations

import zlib

from mas_envs.core import Outcome, TextAECEnv, Transition, wrap
from mas_train.backends.base import GenerationOutput


class ScriptEnv(TextAECEnv):
    metadata = {"name": "script_v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ("solver", "verifier")
    stop_strings = {"solver": ("</answer>",), "verifier": ("</verify>",)}
    default_invalid_action_penalty = 0.1

    def __init__(self, max_loops: int = 2, **kw):
        super().__init__(**kw)
        self.max_loops = max_loops

    def start_episode(self, task):
        self.loops = 0
        self.last_answer = ""
        # a row may open with the verifier ("first_agent"), so one tick holds turns of both agents
        return task.get("first_agent", "solver")

    def prompt_messages(self, agent):
        q = self.task["question"]
        if agent == "solver":
            return [{"role": "system", "content": "Solve."}, {"role": "user", "content": q}]
        return [
            {"role": "system", "content": "Verify."},
            {"role": "user", "content": f"{q}\n{self.last_answer}"},
        ]

    def apply_action(self, agent, action):
        if agent == "solver":
            self.loops += 1
            self.last_answer = action
            invalid = "</answer>" not in action
            return Transition(invalid, None if self.task.get("skip_verifier") else "verifier")
        invalid = "</verify>" not in action
        if "reject" in action and self.loops < self.max_loops:
            return Transition(invalid, "solver")
        return Transition(invalid, None)

    def episode_outcome(self):
        return Outcome(
            float(str(self.task["answer"]) in self.last_answer), str(self.task["answer"]) in self.last_answer
        )


def make_script_env(**kw):
    return wrap(ScriptEnv(**kw))


class ScriptGenerator:
    """Answers from a function of (request index in call, sampling seed); records every call's batch size.

    ``reply(prompt_text, seed) -> str`` gives the completion text; ids are the tokenizer's encoding of it.
    """

    def __init__(self, tokenizer, reply, weight_version: int = 0):
        self.tok = tokenizer
        self.reply = reply
        self.calls: list[int] = []
        self.prompts: list[list[int]] = []
        self.weight_version = weight_version

    def generate(self, prompt_ids, sampling):
        sps = sampling if isinstance(sampling, list | tuple) else [sampling] * len(prompt_ids)
        self.calls.append(len(prompt_ids))
        outs = []
        for ids, sp in zip(prompt_ids, sps, strict=True):
            self.prompts.append(list(ids))
            text = self.reply(self.tok.decode(ids), sp)
            cids = self.tok.encode(text, add_special_tokens=False)
            outs.append(
                GenerationOutput(
                    completion_ids=cids,
                    logprobs=[-0.5] * len(cids),
                    finish_reason="stop",
                    weight_version=self.weight_version,
                )
            )
        return outs


class ParityEnv(ScriptEnv):
    """``ScriptEnv`` whose reward a random-weight model earns: R in [0, 1] is a checksum of the solver's last
    action, so any two different completions almost surely score differently. That gives reward variance in
    every task group, hence non-zero advantages (and gradients) for both agents whatever the sampling seed."""

    metadata = {"name": "parity_v0", "render_modes": ["ansi"], "is_parallelizable": False}

    def episode_outcome(self):
        r = (zlib.crc32(self.last_answer.encode("utf-8", "surrogatepass")) % 1000) / 999
        return Outcome(r, r > 0.5)


def make_parity_env(**kw):
    return wrap(ParityEnv(**kw))


PARITY_TASKS = [
    {"id": f"p{i}", "question": f"Say something of even length #{i}", "answer": "x", "data_source": "parity"}
    for i in range(6)
]
