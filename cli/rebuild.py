"""The pip commands that rebuild llama-cpp-python for what this machine needs (an RPC or GPU
backend, or without the CPU kernels that crashed), as `infer doctor` and `infer worker`
give them."""

from __future__ import annotations


def rebuild_hint(*, rpc: bool = True, gpu: str | None = None) -> str:
    """The pip command that rebuilds llama-cpp-python with the RPC backend and a GPU one."""
    flags = ["-DGGML_RPC=ON"] if rpc else []
    if gpu:
        flags.insert(0, f"-DGGML_{gpu.upper()}=ON")
    return _pip_rebuild(flags)


def _pip_rebuild(flags: list[str]) -> str:
    """pip's command that builds the installed llama-cpp-python again with CMake `flags` (the
    same version: pip would otherwise take the newest, which infer may not have been tested
    with), not from pip's cache, which holds the build being replaced."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pinned = f"llama-cpp-python=={version('llama-cpp-python')}"
    except PackageNotFoundError:
        pinned = "llama-cpp-python"
    return f"CMAKE_ARGS=\"{' '.join(flags)}\" pip install --force-reinstall --no-cache-dir --no-deps {pinned}"


# /proc/cpuinfo flag -> the CMake option of ggml's CPU backend that builds for it
_BUILD_FLAGS = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"),
                ("bmi2", "GGML_BMI2"), ("avx_vnni", "GGML_AVX_VNNI"), ("avx512f", "GGML_AVX512"),
                ("avx512vbmi", "GGML_AVX512_VBMI"), ("avx512_vnni", "GGML_AVX512_VNNI"),
                ("avx512_bf16", "GGML_AVX512_BF16"))


def rebuild_without(buffers: list[str], cpu_flags: set[str], gpu: str | None) -> str:
    """The pip command that rebuilds llama-cpp-python without the extra buffer types that
    crashed: AMX left out of a build for this CPU's other features (a native build takes
    AMX whenever the CPU has it), else the repacked kernels turned off."""
    if "AMX" in buffers:
        flags = ["-DGGML_NATIVE=OFF", *(f"-D{opt}=ON" for flag, opt in _BUILD_FLAGS if flag in cpu_flags),
                 "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    else:
        flags = ["-DGGML_CPU_REPACK=OFF"] + (["-DGGML_CPU_KLEIDIAI=OFF"] if "KleidiAI" in buffers else [])
    if gpu:
        flags.append(f"-DGGML_{gpu.upper()}=ON")
    flags.append("-DGGML_RPC=ON")
    return _pip_rebuild(flags)
