"""Write, register and run your own text environment in 50 lines.

`echo-2agent`: a `writer` proposes a word, a `checker` accepts (`<ok>`) or asks again (`<again>`); the team
reward is 1 when the accepted word is the task's answer. Run: `python examples/custom_env.py`.
"""

from typing import Any

import mas_envs
from mas_envs import Outcome, TextAECEnv, Transition
from mas_envs.core import wrap
from mas_envs.testing import check_env


class EchoEnv(TextAECEnv):
    metadata = {"name": "echo-2agent-v0", "render_modes": ["ansi"], "is_parallelizable": False}
    possible_agents = ("writer", "checker")
    stop_strings = {"writer": (), "checker": ("<ok>", "<again>")}

    def start_episode(self, task: dict[str, Any]) -> str:
        self.word = None
        return "writer"

    def prompt_messages(self, agent: str) -> list[dict[str, str]]:
        ask = (
            "Write the word asked for."
            if agent == "writer"
            else f"The writer wrote {self.word!r}. Reply <ok> or <again>."
        )
        return [
            {"role": "system", "content": f"You are the {agent}."},
            {"role": "user", "content": f"{self.task['question']}\n{ask}"},
        ]

    def apply_action(self, agent: str, action: str) -> Transition:
        if agent == "writer":
            self.word = action.strip()
            return Transition(invalid=not self.word, next_agent="checker")
        if "<ok>" in action:
            return Transition(invalid=False, next_agent=None)
        return Transition(invalid="<again>" not in action, next_agent="writer")

    def episode_outcome(self) -> Outcome:
        ok = self.word == self.task["answer"]
        return Outcome(team_reward=float(ok), success=ok)


TASKS = [
    {"question": "Say the colour of the sky.", "answer": "blue"},
    {"question": "Say 'yes'.", "answer": "yes"},
]
mas_envs.register(
    "echo-2agent-v0", entry_point=lambda **kw: wrap(EchoEnv(**kw)), kwargs={"tasks": TASKS, "max_turns": 6}
)

if __name__ == "__main__":
    env = mas_envs.make("echo-2agent", render_mode="ansi")
    env.reset(options={"task_index": 0})
    script = iter(["green", "<again>", "blue", "<ok>"])
    for agent in env.agent_iter():
        obs, reward, termination, truncation, info = env.last()
        action = None if termination or truncation else next(script)
        print(f"{agent:8s} reward {reward:+.1f} -> {action!r}")
        env.step(action)
    print(env.render())
    # the same conformance checks every built-in env passes (PettingZoo api_test, seeding, pickling, fuzzing)
    print(check_env(lambda **kw: mas_envs.make("echo-2agent", **kw), fuzz_episodes=200))
