"""kbert.hardware: the CPU's flags, and the dtype policy `--dtype auto` picks."""

import platform

import pytest

from kbert import hardware
from tests import skips

# The head of /proc/cpuinfo on two 2-core AMD EPYC machines this project ran
# on: one with AVX-512 BF16 (Zen 4), one with AVX2 alone (Zen 3).
ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu vme de sse sse2 avx2 avx512f avx512dq avx512_bf16 avx512vl gfni
bogomips\t: 5200.00

processor\t: 1
flags\t\t: fpu vme
"""
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme de pse tsc sse4_2 avx f16c fma avx2 sha_ni vaes vpclmulqdq rdpid fsrm
"""
SAPPHIRE_RAPIDS = "model name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: avx512f amx_bf16 amx_tile amx_int8\n"


@pytest.mark.parametrize("text, model, bfloat16", [
    (ZEN4, "AMD EPYC 9B14", True),
    (ZEN3, "AMD EPYC", False),
    (SAPPHIRE_RAPIDS, "Intel(R) Xeon(R) Platinum 8481C", True),
    ("processor\t: 0\n", None, False),
])
def test_cpu_flags_name_native_bfloat16(text, model, bfloat16, tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert hardware.cpuinfo_field("model name", str(path)) == model
    assert hardware.cpu_bfloat16(str(path)) is bfloat16


def test_no_cpuinfo_is_no_bfloat16(tmp_path):
    assert hardware.cpuinfo_field("flags", str(tmp_path / "missing")) is None
    assert hardware.cpu_bfloat16(str(tmp_path / "missing")) is False


def cpuid_bfloat16():
    """Whether this CPU has AVX-512 BF16 dot products, as numpy's own runtime dispatch
    reads it from the CPUID instruction, apart from Linux's /proc/cpuinfo that kbert
    reads. (Every x86 CPU with AMX-BF16 so far, Sapphire Rapids on, also has AVX512_BF16.)"""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False  # kbert's flags are x86's
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_features__
    return __cpu_features__["AVX512BF16"]


def test_auto_is_bfloat16_only_where_this_device_has_it():
    """On this project's CPU-only test machines "auto" follows the CPU's flags;
    any other policy, and None, pass through unchanged."""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU"):
        pytest.skip(skips.ACCELERATOR)
    expected = "mixed_bfloat16" if cpuid_bfloat16() else "float32"
    assert hardware.resolve_dtype("auto") == expected
    lines = []
    assert hardware.log_dtype("auto", lines.append) == expected
    assert lines == [f"dtype auto: {expected} (this device "
                     + ("multiplies bfloat16 natively)" if expected == "mixed_bfloat16" else "has no native bfloat16)")]
    for dtype in ("float32", "mixed_bfloat16", "mixed_float16", None):
        assert hardware.resolve_dtype(dtype) == dtype
        assert hardware.log_dtype(dtype, lines.append) == dtype
    assert len(lines) == 1
