"""Tests that start real mpirun jobs, ps-lite servers or emulated machines."""
