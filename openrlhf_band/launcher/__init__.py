"""What the launcher (examples/scripts/common.sh) leans on: the results table, model preparation, the Ray job's
runtime environment."""
