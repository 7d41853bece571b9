"""The reasoning-gym task: data.py (prepare-data: items from its generators), reward.py (the reward file: its own
scorers, in the timed pool's workers) and agent.py (the multi-turn agent)."""
