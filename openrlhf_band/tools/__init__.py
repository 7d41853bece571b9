"""The tools: the `openrlhf-band` CLI, the bounds table and plot, the CPU demo and the benchmarks."""
