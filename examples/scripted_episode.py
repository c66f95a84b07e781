"""A scripted math-2agent episode on real GSM8K problems: the PettingZoo loop, rewards and the transcript.

The solver is a script that answers wrong on its first attempt (gold + 1) and right after a rejection; the
verifier is an oracle that grades the latest `\\boxed{}` with `mas_envs.rewards.grade_math`. Replace the two
policies with LLM calls (prompts come from `env.observe(agent)` or `info["messages"]`) to run real agents.

    python examples/scripted_episode.py --episodes 2 --seed 0
"""

import argparse

import mas_envs
from mas_envs.rewards import extract_boxed, grade_math


def solver(env, attempt: int) -> str:
    gold = env.unwrapped.task["answer"].replace(",", "")
    if attempt == 0 and gold.lstrip("-").isdigit():
        return f"Adding everything up gives \\boxed{{{int(gold) + 1}}}."
    return f"Re-checking each step, the total is \\boxed{{{gold}}}."


def verifier(env) -> str:
    solution = env.unwrapped.last_solution or ""
    if grade_math(solution, env.unwrapped.task["answer"]):
        return "Every step checks out. <verify>approve</verify>"
    return (
        f"The final value {extract_boxed(solution)} does not follow from the problem. <verify>reject</verify>"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2, help="number of episodes to play")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the first episode (picks the GSM8K problem)"
    )
    args = parser.parse_args()

    env = mas_envs.make("math-2agent", tasks="gsm8k-test", render_mode="ansi")
    for episode in range(args.episodes):
        env.reset(seed=args.seed + episode)
        attempts, returns = 0, dict.fromkeys(env.possible_agents, 0.0)
        for agent in env.agent_iter():
            obs, reward, termination, truncation, info = env.last()
            returns[agent] += reward
            if termination or truncation:
                action = None
            elif agent == "solver":
                action, attempts = solver(env, attempts), attempts + 1
            else:
                action = verifier(env)
            env.step(action)
        print(env.render())
        print(f"returns: {returns}\n")


if __name__ == "__main__":
    main()
