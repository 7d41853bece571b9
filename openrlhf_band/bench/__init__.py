"""The benchmarks (`openrlhf-band bench ...`, `openrlhf-band aot`) and the GPU check's Python side.

Each prints ratios measured side by side in one run (ours against the baseline on the same input)
and writes JSON / CSV under out/bench/ (`common.results_dir`; `--results-dir bench/results` updates the
committed tables). bench/ at the repository root holds the committed results and the shell drivers for
other machines (gpu_check.sh, aot_versions.sh)."""
