"""Peak TFLOPs of known accelerators (dense, no sparsity), and measuring what a device really reaches.

Table values are the vendors' datasheet dense peaks. MFU against them is the convention papers use;
MFU against a *measured* peak (`hfscale peak`) says how close training gets to what matmuls achieve here.
"""

import time

# name fragment (matched against torch.cuda.get_device_name, lower case) -> dtype -> dense TFLOPs.
PEAK_TFLOPS = {
    "h200": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0},
    "h100 pcie": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0},
    "h100": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 67.0},  # SXM
    "a100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "a10g": {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2},
    "l40s": {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "v100-sxm2-16gb": {"fp16": 120.0, "fp32": 15.0},  # the BigScience notes: 16GB ~120, 32GB ~125
    "v100": {"fp16": 125.0, "fp32": 15.7},
    "mi300x": {"bf16": 1307.0, "fp16": 1307.0, "tf32": 653.7, "fp32": 163.4},
    "mi250x": {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7},
    "mi250": {"bf16": 362.1, "fp16": 362.1, "fp32": 90.5},
}


# Devices a user plans for (hfscale estimate/project --device NAME): memory per device in GB (1e9 bytes, as sold)
# and the key of their dense peak in PEAK_TFLOPS.
DEVICES = {
    "A100-40GB": (40.0, "a100"), "A100-80GB": (80.0, "a100"), "H100-80GB": (80.0, "h100"),
    "H100-PCIe-80GB": (80.0, "h100 pcie"), "H200-141GB": (141.0, "h200"), "V100-16GB": (16.0, "v100-sxm2-16gb"),
    "V100-32GB": (32.0, "v100"), "A10G-24GB": (24.0, "a10g"), "L40S-48GB": (48.0, "l40s"),
    "MI250X-128GB": (128.0, "mi250x"), "MI300X-192GB": (192.0, "mi300x"),
}


def device_memory_gb(name: str) -> float:
    """Memory of a device named as in DEVICES (case-insensitive); KeyError for an unknown name."""
    for known, (memory, _) in DEVICES.items():
        if known.lower() == name.lower():
            return memory
    raise KeyError(name)


def device_peak(name: str, dtype: str) -> float | None:
    for known, (_, key) in DEVICES.items():
        if known.lower() == name.lower():
            return PEAK_TFLOPS[key].get(dtype)
    raise KeyError(name)


def table_peak(device_name: str, dtype: str) -> float | None:
    """The datasheet peak for this device and dtype; None for a CPU or an unknown device (never guess)."""
    name = device_name.lower()
    for fragment, peaks in PEAK_TFLOPS.items():  # ordered: specific fragments before general ones
        if fragment in name:
            return peaks.get(dtype)
    return None


def measure_peak_tflops(device: str = "cpu", dtype: str = "fp32", size: int | None = None, seconds: float = 1.0) -> float:
    """Best matmul throughput actually reached: repeated size x size GEMMs for about `seconds`."""
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}[dtype]
    on_cuda = device.startswith("cuda")
    size = size or (8192 if on_cuda else 1024)
    if on_cuda:
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    a = torch.randn(size, size, device=device, dtype=torch_dtype)
    b = torch.randn(size, size, device=device, dtype=torch_dtype)
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    best = 0.0
    torch.matmul(a, b)  # warm-up: kernel selection, allocation
    sync()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(4):
            torch.matmul(a, b)
        sync()
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - start) / 1e12)
    return best
