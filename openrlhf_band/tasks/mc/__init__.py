"""The multiple-choice task, `mc` (CommonsenseQA, MMLU): data.py (prepare-data) and reward.py (the reward file: the
letter after the last 'Answer:')."""
