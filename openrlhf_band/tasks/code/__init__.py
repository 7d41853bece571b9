"""The code task (MBPP, APPS; HumanEval): data.py (prepare-data), reward.py (the reward file: the program against
its tests in openrlhf_band.sandbox) and agent.py (the multi-turn agent: a failing test comes back as a turn)."""
