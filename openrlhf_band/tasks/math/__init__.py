"""The math task (DAPO-Math-17k + MATH; AIME, AMC): data.py (prepare-data), reward.py (the reward file, math-verify
equivalence) and verify.py (what the timed pool's workers run)."""
