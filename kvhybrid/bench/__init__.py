"""Benchmarks: each runs kvhybrid side by side with its peers in one run."""
