"""Commands that operate on an OpenRLHF install, apart from the runtime face in `integration/`: the
patch tool (`patcher.py`: `openrlhf-band patch apply|check|revert|status`), `check-args`
(`check_args.py`: the patched parser without Ray) and the patch set itself (`patches/`, generated
by `patches/regenerate.sh`). Nothing here is imported by the patched OpenRLHF."""
