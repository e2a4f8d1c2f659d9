"""The test harness: jobs (mpirun, kvhybrid-launch), fault injection, emulated machines
(network namespaces, sshd, Slurm) and the attacker of the security test."""
