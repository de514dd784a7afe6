"""What the machine is: its CPU, and the dtype policy it trains fastest under.

`dtype="auto"` (`kbert finetune`, `distill` and `pretrain --dtype auto`)
picks the policy for the device.

bfloat16 pays where the hardware multiplies it natively: NVIDIA GPUs from
Ampere on (compute capability 8.0), TPUs, and x86 CPUs with AVX512_BF16 or
AMX-BF16 dot products. Elsewhere TensorFlow's CPU kernels emulate it and
convert value by value: on a 2-core AMD EPYC with AVX2 alone a MiniLM
fine-tuning step took 14% longer under `mixed_bfloat16` than in float32, and
predicting the dev set 2.3 times as long. So "auto" is `mixed_bfloat16` on
such hardware and float32 everywhere else.
"""

from kbert.logs import to_stderr

AUTO = "auto"
# /proc/cpuinfo flags of x86 bfloat16 dot products (Linux names them so).
CPU_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")
# The first NVIDIA architecture with bfloat16 tensor cores (Ampere).
GPU_BFLOAT16_CAPABILITY = (8, 0)


def resolve_dtype(dtype):
    """`dtype` itself, or for "auto" the policy this device trains fastest under.

    Args:
        dtype: str or None. A Keras dtype policy name, "auto", or None (the
            global policy, float32 unless set).

    Returns:
        str or None: "mixed_bfloat16" or "float32" for "auto", else `dtype`.

    Example:
    >>> resolve_dtype("mixed_float16")
    'mixed_float16'
    """
    if dtype != AUTO:
        return dtype
    return "mixed_bfloat16" if native_bfloat16() else "float32"


def log_dtype(dtype, log=None):
    """`resolve_dtype(dtype)`, saying what "auto" chose through `log` (default: stderr)."""
    resolved = resolve_dtype(dtype)
    if dtype == AUTO:
        reason = "multiplies bfloat16 natively" if resolved == "mixed_bfloat16" else "has no native bfloat16"
        (log or to_stderr)(
            f"dtype auto: {resolved} (this device {reason})"
        )
    return resolved


def native_bfloat16():
    """Whether the device Keras trains on multiplies bfloat16 in hardware (see the module)."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.config.list_physical_devices("TPU"):
            return True
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            details = tf.config.experimental.get_device_details(gpus[0])
            return tuple(details.get("compute_capability", (0, 0))) >= GPU_BFLOAT16_CAPABILITY
    elif backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform == "tpu":
            return True
        if device.platform == "gpu":
            capability = tuple(int(part) for part in str(device.compute_capability).split("."))
            return capability >= GPU_BFLOAT16_CAPABILITY
    return cpu_bfloat16()


def cpu_bfloat16(cpuinfo="/proc/cpuinfo"):
    """Whether this CPU has bfloat16 dot products (`CPU_BFLOAT16_FLAGS` among its flags).

    False where the flags cannot be read (not Linux): float32 is the safe
    choice there.
    """
    flags = (cpuinfo_field("flags", cpuinfo) or "").split()
    return any(flag in flags for flag in CPU_BFLOAT16_FLAGS)


def cpuinfo_field(key, cpuinfo="/proc/cpuinfo"):
    """The value of the first `key` line of Linux's `cpuinfo` ("model name", "flags"), or None."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None
