"""Peak TFLOPs of known accelerators (dense, no sparsity), and measuring what a device really reaches.

Table values are the vendors' datasheet dense peaks. MFU against them is the convention papers use;
MFU against a *measured* peak (`hfscale peak`) says how close training gets to what matmuls achieve here.
"""

import re
import time

from .memory import DTYPE_BYTES
from .precision import storage_dtype

# Datasheet dense peaks (no sparsity) per dtype, TFLOPs, by device key (see DEVICE_PATTERNS for the names). fp8: the
# float8 tensor cores' (Ada, Hopper, Blackwell, MI300), against which an --fp8 run's MFU is also reported.
PEAK_TFLOPS = {
    "b200": {"fp8": 4500.0, "bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 80.0},  # HGX B200, 1000 W
    "h200": {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0},
    "h100": {"fp8": 1979.0, "bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0},  # SXM (H800: the same)
    "h100 nvl": {"fp8": 1670.5, "bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "h100 pcie": {"fp8": 1513.0, "bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0},
    "a100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},  # SXM and PCIe; A800 the same
    "a10g": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2},
    "l40s": {"fp8": 733.0, "bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "l4": {"fp8": 242.5, "bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "v100-16gb": {"fp16": 120.0, "fp32": 15.0},  # the BigScience notes: 16GB ~120, 32GB ~125
    "v100": {"fp16": 125.0, "fp32": 15.7},
    "mi300x": {"fp8": 2614.9, "bf16": 1307.0, "fp16": 1307.0, "tf32": 653.7, "fp32": 163.4},
    "mi250x": {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7},
    "mi250": {"bf16": 362.1, "fp16": 362.1, "fp32": 90.5},
}
# Datasheet memory bandwidth (HBM/GDDR), GB/s, by the same keys: what bandwidth-bound work runs at (PowerSGD's
# compression: formulas/comm.powersgd_compute_s). A100: the 80GB SXM's (the 40GB has 1555).
MEMORY_BW_GB_S = {"b200": 8000.0, "h200": 4800.0, "h100": 3350.0, "h100 nvl": 3900.0, "h100 pcie": 2000.0,
                  "a100": 2039.0, "a10g": 600.0, "l40s": 864.0, "l4": 300.0, "v100-16gb": 900.0, "v100": 900.0,
                  "mi300x": 5300.0, "mi250x": 3277.0, "mi250": 3277.0}
# torch.cuda.get_device_name -> key: whole words, most specific first, so "RTX A1000" is no A100 and an H100 NVL
# or PCIe card does not get the SXM peak. Names are lower-cased with "nvidia"/"amd"/"instinct" removed first.
DEVICE_PATTERNS = [
    (r"\bb200\b", "b200"), (r"\bh200\b", "h200"),
    (r"\bh[18]00\b.*\bnvl\b", "h100 nvl"), (r"\bh[18]00\b.*\bpcie\b", "h100 pcie"), (r"\bh[18]00\b", "h100"),
    (r"\ba[18]00\b", "a100"), (r"\ba10g\b", "a10g"), (r"\bl40s\b", "l40s"), (r"\bl4\b", "l4"),
    (r"\bv100\b.*\b16\s?gb\b", "v100-16gb"), (r"\bv100\b", "v100"),
    (r"\bmi300x\b", "mi300x"), (r"\bmi250x\b", "mi250x"), (r"\bmi250\b", "mi250"),
]
MIG_COMPUTE_SLICES = 7  # A100/H100 split into at most 7 compute slices; "MIG 3g.40gb" has 3 of them


# Devices a user plans for (hfscale estimate/project --device NAME): memory per device in GB (1e9 bytes, as sold)
# and the key of their dense peak in PEAK_TFLOPS.
DEVICES = {
    "A100-40GB": (40.0, "a100"), "A100-80GB": (80.0, "a100"), "H100-80GB": (80.0, "h100"),
    "H100-PCIe-80GB": (80.0, "h100 pcie"), "H200-141GB": (141.0, "h200"), "V100-16GB": (16.0, "v100-16gb"),
    "V100-32GB": (32.0, "v100"), "A10G-24GB": (24.0, "a10g"), "L40S-48GB": (48.0, "l40s"),
    "MI250X-128GB": (128.0, "mi250x"), "MI300X-192GB": (192.0, "mi300x"),
}


def device_memory_gb(name: str) -> float:
    """Memory of a device named as in DEVICES (case-insensitive); KeyError for an unknown name."""
    for known, (memory, _) in DEVICES.items():
        if known.lower() == name.lower():
            return memory
    raise KeyError(name)


def memory_of_device_name(device_name: str) -> float | None:
    """GB of memory of a device as torch names it ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"): the size its
    name states, else the only size its family is sold in here (DEVICES); None when that cannot be told."""
    stated = re.search(r"(\d+)\s*GB\b", device_name, re.IGNORECASE)
    if stated:
        return float(stated.group(1))
    key = device_key(device_name)
    sizes = {memory for memory, k in DEVICES.values() if k == key}
    return sizes.pop() if key and len(sizes) == 1 else None


def device_peak(name: str, dtype: str) -> float | None:
    for known, (_, key) in DEVICES.items():
        if known.lower() == name.lower():
            return PEAK_TFLOPS[key].get(dtype)
    raise KeyError(name)


def device_key(device_name: str) -> str | None:
    """The PEAK_TFLOPS key of a device name as torch reports it, or as DEVICES names it; None when it is not a device
    hfscale knows."""
    for known, (_, key) in DEVICES.items():
        if known.lower() == device_name.lower():
            return key
    name = " ".join(re.sub(r"\b(nvidia|amd|instinct|tesla)\b", " ", device_name.lower()).split())
    for pattern, key in DEVICE_PATTERNS:
        if re.search(pattern, name):
            return key
    return None


def table_peak(device_name: str, dtype: str) -> float | None:
    """The datasheet peak for this device and dtype (a MIG slice gets its share); None for a CPU or an unknown
    device - never a guess."""
    key = device_key(device_name)
    peak = PEAK_TFLOPS[key].get(dtype) if key else None
    mig = re.search(r"\bmig (\d)g\.", device_name.lower())
    return peak * int(mig.group(1)) / MIG_COMPUTE_SLICES if peak and mig else peak


MATMUL_OPERANDS = 3  # a @ b = c: each size x size


def matmul_memory_refusal(size: int, dtype: str, memory_bytes: float, where: str) -> str | None:
    """Why `hfscale peak --size` cannot hold its matrices in `memory_bytes` (`where`: "a GPU's", "the host's
    available"), or None. Before: torch's allocator error as a traceback, or the OOM killer."""
    need = MATMUL_OPERANDS * size * size * DTYPE_BYTES[storage_dtype(dtype)]
    if need <= memory_bytes:
        return None
    return (f"--size {size} needs {need / 1e9:,.1f} GB for its three {dtype} matrices, more than {where} "
            f"{memory_bytes / 1e9:,.1f} GB: give a smaller --size")


def measure_peak_tflops(device: str = "cpu", dtype: str = "fp32", size: int | None = None, seconds: float = 1.0) -> float:
    """Best matmul throughput actually reached: repeated size x size GEMMs for about `seconds`. Leaves no trace:
    the TF32 setting is restored, the matrices freed and (on CUDA) the allocator's peak reset, so neither the run's
    precision nor its measured peak memory carries this probe. Uses torch's fp32_precision API, as transformers does
    (torch refuses to read the legacy allow_tf32 flag once the new one was set)."""
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}[dtype]
    on_cuda = device.startswith("cuda")
    size = size or (8192 if on_cuda else 512)  # a CPU core reaches its peak at 512 already
    matmul = torch.backends.cuda.matmul
    tf32_before = matmul.fp32_precision
    try:
        if on_cuda:
            matmul.fp32_precision = "tf32" if dtype == "tf32" else "ieee"
        a = torch.randn(size, size, device=device, dtype=torch_dtype)
        b = torch.randn(size, size, device=device, dtype=torch_dtype)
        sync = torch.cuda.synchronize if on_cuda else (lambda: None)
        best = 0.0
        torch.matmul(a, b)  # warm-up: kernel selection, allocation
        sync()
        # at least one timed round: a process descheduled past the deadline (a loaded machine) still measures
        deadline = time.perf_counter() + seconds
        while not best or time.perf_counter() < deadline:
            start = time.perf_counter()
            for _ in range(4):
                torch.matmul(a, b)
            sync()
            best = max(best, 4 * 2 * size**3 / (time.perf_counter() - start) / 1e12)
        del a, b
        return best
    finally:
        matmul.fp32_precision = tf32_before
        if on_cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
