"""kvhybrid: a hybrid MPI + parameter-server KVStore for MXNet."""
import logging
import os

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


class BuildAgainstMXNet(build_ext):
    """Compiles the C++ helpers (kvhybrid/tensor_collectives/*.cc) against the
    installed MXNet's headers, as Horovod builds its MXNet operators: install with
    ``pip install --no-build-isolation`` so MXNet is importable here. Without MXNet's
    headers or a C++ compiler kvhybrid works without the helper, a little slower
    (ndarray_view.py says which it uses)."""

    def build_extensions(self):
        try:
            import mxnet
            include = mxnet.libinfo.find_include_path()
            library = os.path.dirname(mxnet.libinfo.find_lib_path()[0])
            mkldnn = mxnet.runtime.Features().is_enabled("MKLDNN")
        except Exception as exc:   # (an isolated build, or a broken MXNet)
            logging.warning("kvhybrid: not building its C++ helper (MXNet not importable: "
                            "%s); install with pip --no-build-isolation to build it", exc)
            return
        for ext in self.extensions:
            ext.include_dirs += [include, f"{include}/mkldnn"]
            if ext.libraries:   # (libmxnet.so has no soname: linked by its directory)
                ext.library_dirs.append(library)
                ext.runtime_library_dirs.append(library)
            # the NDArray's layout depends on MKLDNN; the rest turns off what the headers
            # would otherwise want (CUDA, BLAS headers) and matches the wheel's C++ ABI
            ext.define_macros += [("MXNET_USE_MKLDNN", "1" if mkldnn else "0"),
                                  ("MSHADOW_USE_CUDA", "0"), ("MSHADOW_USE_MKL", "0"),
                                  ("MSHADOW_USE_CBLAS", "0"), ("MSHADOW_USE_SSE", "0"),
                                  ("MSHADOW_USE_F16C", "0"), ("_GLIBCXX_USE_CXX11_ABI", "0")]
        super().build_extensions()


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
    # loaded with ctypes, not imported: a plain shared library with a module's file name
    # (all but _ids, a Python module)
    ext_modules=[Extension("kvhybrid.tensor_collectives._ndarray_aux",
                           ["kvhybrid/tensor_collectives/ndarray_aux.cc"], language="c++",
                           depends=["kvhybrid/tensor_collectives/ids_in_table.h"],
                           libraries=["mxnet"],   # (MXNet's C API and CopyFromTo)
                           extra_compile_args=["-O2", "-std=c++17"], optional=True),
                 # the sleeping barrier of a group's ranks on one host (needs no MXNet)
                 Extension("kvhybrid.tensor_collectives._host_barrier",
                           ["kvhybrid/tensor_collectives/host_barrier.cc"], language="c++",
                           extra_compile_args=["-O2", "-std=c++17"], optional=True),
                 # the start of the store's engine operations without Python on MXNet's
                 # threads (needs no MXNet)
                 Extension("kvhybrid.tensor_collectives._engine_start",
                           ["kvhybrid/tensor_collectives/engine_start.cc"], language="c++",
                           extra_compile_args=["-O2", "-std=c++17"], optional=True),
                 # the row group master's merges of the ranks' row ids and rows (needs no
                 # MXNet)
                 Extension("kvhybrid.tensor_collectives._rows",
                           ["kvhybrid/tensor_collectives/rows.cc"], language="c++",
                           extra_compile_args=["-O3", "-std=c++17"], optional=True),
                 # the patient waits for MPI requests, tested and slept between without
                 # the GIL (needs no MXNet, nor MPI's headers: it calls the MPI_Test of the MPI
                 # library mpi4py loaded)
                 Extension("kvhybrid.tensor_collectives._patient_wait",
                           ["kvhybrid/tensor_collectives/patient_wait.cc"], language="c++",
                           extra_compile_args=["-O2", "-std=c++17"], optional=True),
                 # a batch's row ids copied and checked (needs no MXNet; a Python module,
                 # imported: called on the caller's thread every step)
                 Extension("kvhybrid.tensor_collectives._ids",
                           ["kvhybrid/tensor_collectives/ids.cc"], language="c++",
                           depends=["kvhybrid/tensor_collectives/ids_in_table.h"],
                           extra_compile_args=["-O3", "-std=c++17"], optional=True),
                 # the store's SGD update on its communication thread (needs no MXNet; no
                 # contraction into FMA, as MXNet's own kernel)
                 Extension("kvhybrid.kvstore._sgd_update", ["kvhybrid/kvstore/sgd_update.cc"],
                           language="c++", optional=True,
                           extra_compile_args=["-O3", "-std=c++17", "-ffp-contract=off"])],
    cmdclass={"build_ext": BuildAgainstMXNet},
    # no scipy: MXNet imports it wherever it is installed (0.3 s of CPU in every process)
    install_requires=["mxnet==1.9.1", "numpy==1.23.5", "mpi4py>=4,<5"],
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
        # (scikit-learn, for the test that the kept digits are its copy, is not one of them:
        # scripts/run_tests.sh puts it under .venv/sklearn, away from the jobs' MXNet)
        "test": ["pytest>=7", "pytest-timeout>=2", "psutil>=5.9", "matplotlib>=3.5"],
    },
    entry_points={"console_scripts": ["kvhybrid-launch=kvhybrid.launch.cli:main"]},
)
