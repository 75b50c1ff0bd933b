"""Builds fairring_py._C against the installed torch.

    pip install --no-build-isolation -e .

The CPU sources (csrc/**/*.cpp) are always built.  When the installed torch has
CUDA and nvcc is found, the CUDA sources (csrc/**/*.cu) are compiled in too and
FAIRRING_WITH_CUDA is defined, so the same tree serves both builds.

FAIRRING_SANITIZE=thread (or address, undefined) builds the C++ sources with
that sanitizer (-fsanitize=..., -O1 -g); see "Sanitizer builds" in docs/DEVELOPING.md
for how to run the tests under it (the runtime must be preloaded).

The C++ sources build without debug information (-g0; Python's own flags ask for
-g): it took about 40% of the compiler's time and 95% of the module's size, and
changes no generated code.  FAIRRING_DEBUG_INFO=1 keeps it (for gdb and perf with
line numbers); a sanitizer build always does.
"""
import glob
import hashlib
import os
import shutil

from setuptools import find_packages, setup
from torch.utils import cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))


def _sources(pattern):
    return sorted(
        os.path.relpath(p, HERE)
        for p in glob.glob(os.path.join(HERE, "csrc", "**", pattern), recursive=True)
    )


def _want_cuda():
    forced = os.environ.get("FAIRRING_BUILD_CUDA")
    if forced is not None:
        return forced not in ("0", "", "false", "no")
    import torch

    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def _wheel_cuda_includes(site):
    """Include folders for the headers the pip NVIDIA wheels of torch ship and
    the toolkit at CUDA_HOME may lack (cuBLAS, cuSPARSE, ... which torch's
    headers include; nccl.h).  Only what the toolkit lacks: its own headers
    (cuda.h, cuda_runtime.h) must win, or a toolkit older than torch's CUDA
    (nvcc 13.0 with torch 2.15's CUDA 13.2 headers) fails CCCL's check that
    compiler and headers match.  Those headers are reached through a folder of
    links under build/."""
    toolkit = os.path.join(cpp_extension.CUDA_HOME or "", "include")
    # One folder per torch installation, made afresh (links, nothing else).
    links = os.path.join(HERE, "build", "wheel-cuda-include-" + hashlib.sha1(site.encode()).hexdigest()[:10])
    shutil.rmtree(links, ignore_errors=True)
    out = []
    for extra in ("nvidia/cu13/include", "nvidia/cuda_runtime/include", "nvidia/nccl/include"):
        path = os.path.join(site, extra)
        if not os.path.isdir(path):
            continue
        if not os.path.isdir(toolkit):
            out.append(path)
            continue
        os.makedirs(links, exist_ok=True)
        for name in os.listdir(path):
            link = os.path.join(links, name)
            if os.path.exists(os.path.join(toolkit, name)) or os.path.lexists(link):
                continue  # the toolkit's own, or an earlier wheel's
            os.symlink(os.path.join(path, name), link)
    if os.path.isdir(links):
        out.append(links)
    return out


_SANITIZERS = ("thread", "address", "undefined")


def _sanitize_flags():
    """FAIRRING_SANITIZE=thread|address|undefined: compile and link flags."""
    which = os.environ.get("FAIRRING_SANITIZE", "").strip()
    if not which:
        return [], []
    if which not in _SANITIZERS:
        raise SystemExit(f"FAIRRING_SANITIZE={which!r}: expected one of {', '.join(_SANITIZERS)}")
    flag = f"-fsanitize={which}"
    return [flag, "-O1", "-g", "-fno-omit-frame-pointer"], [flag]


def _extension():
    san_cxx, san_link = _sanitize_flags()
    # The sanitizer's -O1 comes after -O3 and wins.
    debug_info = "-g" if os.environ.get("FAIRRING_DEBUG_INFO") == "1" else "-g0"
    cxx_flags = ["-O3", "-fwrapv", "-Wall", "-Wno-unused-function", debug_info] + san_cxx
    include_dirs = [os.path.join(HERE, "csrc")]
    sources = _sources("*.cpp")
    if _want_cuda():
        cu_sources = _sources("*.cu")
        # The pip NVIDIA wheels ship headers (cuda_runtime, nccl) outside CUDA_HOME.
        import torch

        site = os.path.dirname(os.path.dirname(torch.__file__))
        include_dirs += _wheel_cuda_includes(site)
        return cpp_extension.CUDAExtension(
            "fairring_py._C",
            sources + cu_sources,
            include_dirs=include_dirs,
            define_macros=[
                ("FAIRRING_WITH_CUDA", "1"),
                # What the CUDA kernels were built for, as fairring_py.info reports it.
                ("FAIRRING_CUDA_ARCH_LIST",
                 '"%s"' % os.environ.get("TORCH_CUDA_ARCH_LIST", "torch's default (the GPUs seen at build time)")),
            ],
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3"]},
            extra_link_args=["-lrt", "-ldl"] + san_link,  # dl: NCCL is loaded at run time
        )
    return cpp_extension.CppExtension(
        "fairring_py._C",
        sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags},
        extra_link_args=["-lrt"] + san_link,
    )


setup(
    name="fairring",
    version="0.1.0",
    description="Hierarchical, reduction-server all-reduce as a PyTorch distributed backend",
    packages=find_packages(include=["fairring_py", "fairring_py.*"]),
    # torch imports this module's register() at `import torch` (its device-backend
    # autoload), so init_process_group("fairring") works without `import fairring_py`.
    # fairring: `import fairring`, what Meta's PARAM benchmark runs for its
    # `--backend fairring` (README).
    py_modules=["_fairring_autoload", "fairring"],
    entry_points={
        "torch.backends": ["fairring = _fairring_autoload:register"],
        "console_scripts": ["fairring-server = fairring_py.server:main"],
    },
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
    python_requires=">=3.9",
    install_requires=["torch>=2.11"],
    extras_require={"test": ["pytest"]},
)
