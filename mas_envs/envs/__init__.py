"""The built-in envs: one flat list of `register(...)` calls (entry points are imported only at `make`).

Versions: bump `-vN` whenever an env's prompts, parsing, reward or turn order change.
"""

from mas_envs.registration import register

# Math: solver <-> verifier loop, and the solver-alone baseline.
register("math-2agent-v0", entry_point="mas_envs.envs.math.math_2agent:env")
register("math-1agent-v0", entry_point="mas_envs.envs.math.math_1agent:env")
# Math: a proposer answers once; a fixer retries (up to max_fixes) only while the grader says wrong.
register("math-fixer-v0", entry_point="mas_envs.envs.math.math_fixer:env")

# Search: verifier -> searcher | answerer with a FAISS E5 retriever, and the Search-R1-style single agent.
register("search-3agent-v0", entry_point="mas_envs.envs.search.search_3agent:env")
register("search-1agent-v0", entry_point="mas_envs.envs.search.search_1agent:env")

# Two-player games (mas_envs.games): PettingZoo's classic games through the text bridge, and Kuhn poker.
register("tictactoe-v0", entry_point="mas_envs.games.tictactoe:env")
register("connect-four-v0", entry_point="mas_envs.games.connect_four:env")
register("kuhn-poker-v0", entry_point="mas_envs.games.kuhn:env")
