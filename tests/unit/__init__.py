"""Tests of pure logic: no MPI job, no parameter server; seconds in all."""
