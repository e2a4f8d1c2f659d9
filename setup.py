"""kvhybrid: a hybrid MPI + parameter-server KVStore for MXNet."""
from setuptools import find_packages, setup

setup(
    name="kvhybrid",
    version="0.1.0",
    description="Hybrid MPI allreduce + parameter-server KVStore for MXNet (mx.kv.create('hybrid-mpi'))",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=find_packages(include=["kvhybrid", "kvhybrid.*"]) + ["kvhybrid.launch"],
    package_dir={"kvhybrid.launch": "launch"},
    package_data={"kvhybrid.launch": ["*.conf", "*.sh"]},
    # scipy: the partition tuner's least-squares fit (kvhybrid-launch --tune-partitions)
    install_requires=["mxnet==1.9.1", "numpy==1.23.5", "mpi4py>=4,<5", "scipy>=1.9"],
    extras_require={
        # The CUDA 11.7 wheel replaces the CPU one: pip uninstall mxnet first.
        "gpu": ["mxnet-cu117==1.9.1"],
        # Horovod must be built against the installed MXNet; see scripts/setup.sh for the flags
        # (HOROVOD_WITH_MXNET=1 HOROVOD_WITH_MPI=1, pip --no-build-isolation).
        "horovod": ["horovod==0.28.1"],
        # benchmarks/ (python -m benchmarks.*, from the repository; not installed): plots; the load benchmark samples CPU with psutil
        "bench": ["matplotlib>=3.5", "psutil>=5.9"],
        # experiments/ (python -m experiments, from the repository; not installed): its plots
        # (its digits data lie in experiments/data)
        "experiments": ["matplotlib>=3.5"],
        # scikit-learn: the test that the kept digits are its copy
        "test": ["pytest>=7", "pytest-timeout>=2", "psutil>=5.9", "scikit-learn>=1.1",
                 "matplotlib>=3.5"],
    },
    entry_points={"console_scripts": ["kvhybrid-launch=kvhybrid.launch.cli:main"]},
)
