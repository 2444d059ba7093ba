"""Bytes of activations per micro-batch: what a training step keeps after the forward, its peak at the start of the
backward, and (under checkpointing) what the backward holds at its end - for HF's GPT-2, BLOOM, Llama (and Qwen2 and
SmolLM3, which keep what Llama keeps), Qwen3, Gemma 3, OLMo 2 and Phi-3, by device, precision, attention, checkpointing,
torch.compile, tensor parallelism and the fused loss. Coefficients fitted to measurements
(benchmarks/calibrate_activations.py); pure functions, no torch at import. formulas/memory.py adds them to the model
states of a rank; docs/estimate.md has the tables.
"""

from dataclasses import dataclass
from math import ceil, log2

from ..models.family import family
from .precision import block_linears, float8_block_elements, float8_operand_bytes
from .metrics import ModelShape

# Bytes per element of each feature (ACTIVATION_FEATURES; activation_features counts the elements), fitted per device
# by benchmarks/calibrate_activations.py to what autograd keeps after the forward in hfscale's training step;
# mode = family/attention/precision/checkpointing. A CPU and a GPU keep different tensors (SDPA's flash kernel keeps no
# s x s matrix; autocast caches other copies), hence a table per device. A mode no GPU has measured falls back to the
# CPU fit and says so. The rows each table was fitted on, and how well: docs/estimate.md ("Where the tables come from").
ACTIVATION_FEATURES = ("per layer b·s·h", "per layer b·a·s²", "b·s·V logits", "b·s·h", "b·s² mask",
                       "weight matrices (autocast saves their bf16 copies)", "per layer b·s·f (MLP width)",
                       "per layer b·s·kv (key/value width)", "per layer b·s·q (query width)")
# GPT-2's and BLOOM's MLP is 4h wide and their keys and values h: the first feature holds those tensors, and their modes
# have the first six coefficients. A family whose MLP, key/value and query widths vary apart from h (Llama, Qwen3:
# Family.own_widths) has nine. A row of eight was fitted where the queries were h wide, its b·s·h term holding theirs
# (the CUDA Llama rows; OLMo 2's, whose heads are always hidden / heads wide): it serves a shape whose queries are h
# wide alone (fitted_row).
ACTIVATION_COEFFICIENTS: dict[str, dict[str, tuple[float, ...]]] = {
    "cpu": {
    'gpt2/eager/fp32/0': (112.228, 3.993, 3.997, 7.447, 0.379, -0.006),
    'gpt2/eager/fp32/1': (4.046, -0.001, 4.0, 7.887, 4.054, -0.001),
    'gpt2/eager/autocast_bf16/0': (60.389, 5.979, 3.982, 4.867, 1.018, 2.016),
    'gpt2/eager/autocast_bf16/1': (3.332, -0.008, 4.18, 6.297, 4.49, 0.48),
    'gpt2/eager/bf16/0': (56.295, 1.991, 3.992, 4.149, 0.491, -0.048),
    'gpt2/eager/bf16/1': (2.13, -0.011, 4.0, 3.886, 2.25, -0.003),
    'gpt2/sdpa/fp32/0': (112.256, -0.007, 3.996, 7.195, 0.382, 0.001),
    'gpt2/sdpa/fp32/1': (4.034, -0.001, 4.0, 7.977, 0.051, -0.004),
    'gpt2/sdpa/autocast_bf16/0': (60.167, -0.003, 3.99, 5.245, 0.465, 2.04),
    'gpt2/sdpa/autocast_bf16/1': (3.356, -0.016, 4.184, 6.351, 0.43, 0.485),
    'gpt2/sdpa/bf16/0': (56.217, -0.005, 3.993, 3.932, 0.535, -0.032),
    'gpt2/sdpa/bf16/1': (2.157, -0.007, 3.995, 4.307, 0.166, -0.037),
    'bloom/eager/fp32/0': (64.137, 3.995, 3.998, 11.805, 0.285, -0.008),
    'bloom/eager/fp32/1': (4.038, -0.001, 4.0, 11.967, 4.042, -0.003),
    'bloom/eager/autocast_bf16/0': (36.151, 5.994, 3.991, 9.198, 0.596, 2.041),
    'bloom/eager/autocast_bf16/1': (3.423, -0.022, 4.171, 10.446, 4.92, 0.463),
    'bloom/eager/bf16/0': (32.314, 5.98, 3.999, 5.613, 0.524, -0.011),
    'bloom/eager/bf16/1': (2.154, -0.015, 3.991, 6.271, 2.322, -0.02),
    # Llama: its MLP, key/value and query widths varied apart from h (HEAD_WIDTH_SHAPES)
    'llama/eager/fp32/0': (24.176, 3.98, 3.988, 11.016, 0.916, 0.034, 15.991, -0.112, 16.155),
    'llama/eager/fp32/1': (4.167, -0.019, 3.995, 10.641, 4.792, 0.043, -0.016, -0.064, 0.112),
    'llama/eager/autocast_bf16/0': (25.762, 5.996, 3.986, 9.542, 0.704, 2.064, 8.006, 0.347, 8.056),
    'llama/eager/autocast_bf16/1': (4.426, -0.015, 4.171, 8.324, 5.366, 0.597, -0.303, -0.336, -0.05),
    'llama/eager/bf16/0': (15.919, 5.986, 3.99, 7.742, 0.584, -0.012, 8.094, 0.153, 8.026),
    'llama/eager/bf16/1': (1.881, -0.007, 3.996, 7.637, 2.315, 0.034, 0.025, -0.033, 0.091),
    'llama/sdpa/fp32/0': (24.247, -0.009, 3.997, 10.859, 0.789, 0.015, 15.978, 8.077, 8.012),
    'llama/sdpa/fp32/1': (3.991, -0.017, 3.994, 11.339, 0.739, 0.049, -0.018, -0.093, 0.14),
    'llama/sdpa/autocast_bf16/0': (26.066, -0.001, 3.985, 9.914, 0.644, 2.045, 7.899, 4.256, 4.066),
    'llama/sdpa/autocast_bf16/1': (4.64, -0.036, 4.155, 7.247, 1.865, 0.636, -0.297, -0.5, 0.024),
    'llama/sdpa/bf16/0': (15.947, 0.011, 3.993, 7.898, 0.37, -0.001, 8.002, 4.096, 4.058),
    'llama/sdpa/bf16/1': (1.899, -0.008, 3.999, 7.537, 0.32, 0.06, -0.002, -0.006, 0.055),
    # Qwen3: its query width (heads x head_dim) varied apart from h too; its per-head q/k norms keep their inputs and
    # outputs, counted in the b·s·q and b·s·kv terms
    'qwen3/eager/fp32/0': (24.101, 3.993, 3.99, 11.657, 0.7, 0.006, 15.979, 7.998, 24.139),
    'qwen3/eager/fp32/1': (4.117, -0.007, 3.998, 11.654, 4.463, 0.037, -0.108, 0.14, 0.066),
    'qwen3/eager/autocast_bf16/0': (25.946, 6.0, 3.992, 11.124, 0.33, 2.01, 7.914, 5.961, 14.191),
    'qwen3/eager/autocast_bf16/1': (4.706, -0.036, 4.174, 5.274, 5.812, 0.713, -0.285, -0.209, -0.069),
    'qwen3/eager/bf16/0': (15.945, 6.005, 3.995, 8.32, 0.156, 0.009, 7.977, 6.067, 14.131),
    'qwen3/eager/bf16/1': (1.491, 0.0, 4.0, 10.067, 1.964, -0.015, -0.007, 0.121, 0.033),
    'qwen3/sdpa/fp32/0': (24.028, -0.005, 4.003, 11.255, 0.701, 0.048, 15.953, 16.027, 16.173),
    'qwen3/sdpa/fp32/1': (3.977, -0.018, 3.983, 12.097, 0.631, 0.012, -0.012, 0.027, 0.096),
    'qwen3/sdpa/autocast_bf16/0': (26.098, 0.013, 3.985, 10.063, 0.536, 2.02, 7.936, 10.075, 10.096),
    'qwen3/sdpa/autocast_bf16/1': (4.248, -0.031, 4.197, 9.643, 0.641, 0.536, -0.215, -0.303, -0.023),
    'qwen3/sdpa/bf16/0': (16.041, 0.03, 3.998, 8.734, -0.244, -0.001, 7.906, 10.362, 9.96),
    'qwen3/sdpa/bf16/1': (1.499, -0.004, 3.999, 9.889, 0.021, -0.001, -0.005, 0.062, 0.061),
    # Gemma 3: Qwen3's attention in a block of four norms, a GeGLU MLP, its embedding scaled (HEAD_WIDTH_SHAPES)
    'gemma3/eager/fp32/0': (40.471, 3.991, 3.991, 11.608, 0.539, -0.049, 16.003, 8.096, 24.014),
    'gemma3/eager/fp32/1': (6.112, -0.029, 3.977, 0.953, 5.633, 0.212, -0.049, -0.218, 0.161),
    'gemma3/eager/autocast_bf16/0': (42.436, 6.002, 4.001, 8.392, 0.421, 2.048, 7.948, 7.911, 16.145),
    'gemma3/eager/autocast_bf16/1': (6.584, -0.046, 4.147, -2.701, 6.591, 0.787, -0.318, -0.468, 0.079),
    'gemma3/eager/bf16/0': (35.761, 5.996, 3.997, 10.176, 0.356, -0.012, 8.038, 8.074, 16.27),
    'gemma3/eager/bf16/1': (2.859, -0.01, 3.988, 5.417, 2.616, 0.084, -0.038, 0.055, 0.101),
    'gemma3/sdpa/fp32/0': (40.346, -0.008, 3.999, 10.402, 0.865, 0.018, 15.971, 16.012, 16.158),
    'gemma3/sdpa/fp32/1': (4.135, -0.015, 3.991, 11.104, 0.55, 0.024, -0.005, 0.029, 0.108),
    'gemma3/sdpa/autocast_bf16/0': (42.35, 0.018, 3.996, 8.793, 0.57, 2.035, 7.892, 12.14, 12.097),
    'gemma3/sdpa/autocast_bf16/1': (4.478, -0.03, 4.183, 8.519, 0.888, 0.572, -0.287, -0.325, 0.089),
    'gemma3/sdpa/bf16/0': (36.264, 0.013, 4.005, 9.736, -0.088, -0.004, 7.969, 11.816, 12.207),
    'gemma3/sdpa/bf16/1': (1.977, -0.007, 3.997, 9.784, 0.259, 0.011, -0.016, -0.003, 0.11),
    # OLMo 2: Llama's tensors, its norms after each sublayer and on q and k over all heads; its queries h wide, their
    # tensors in the b·s·h term (LLAMA_SHAPES: eight terms, calibrate_activations.fold_query_width)
    'olmo2/eager/fp32/0': (48.188, 3.993, 4.008, 10.845, 0.363, 0.032, 16.012, 8.039),
    'olmo2/eager/fp32/1': (4.103, -0.013, 3.992, 11.657, 4.631, 0.013, 0.005, -0.101),
    'olmo2/eager/autocast_bf16/0': (42.193, 5.982, 3.981, 9.456, 0.669, 2.054, 7.951, 8.353),
    'olmo2/eager/autocast_bf16/1': (4.499, -0.024, 4.176, 8.442, 5.099, 0.596, -0.292, -0.404),
    'olmo2/eager/bf16/0': (36.292, 5.972, 3.996, 8.591, 0.841, 0.051, 8.028, 8.16),
    'olmo2/eager/bf16/1': (2.195, 0.0, 3.992, 8.898, 2.69, 0.035, -0.021, -0.044),
    'olmo2/sdpa/fp32/0': (40.529, -0.016, 3.995, 10.474, 0.792, 0.009, 15.971, 15.916),
    'olmo2/sdpa/fp32/1': (4.017, -0.012, 3.996, 11.877, 0.558, 0.001, 0.015, -0.081),
    'olmo2/sdpa/autocast_bf16/0': (38.363, -0.011, 3.983, 8.351, 1.117, 2.099, 7.904, 12.094),
    'olmo2/sdpa/autocast_bf16/1': (4.48, -0.026, 4.163, 7.785, 1.348, 0.614, -0.261, -0.376),
    'olmo2/sdpa/bf16/0': (31.968, 0.011, 3.992, 9.816, 0.639, -0.006, 8.039, 12.102),
    'olmo2/sdpa/bf16/1': (1.59, 0.007, 4.001, 10.038, 0.326, 0.041, 0.062, 0.068),
    # Phi-3: its q/k/v and gate/up fused, heads hidden / heads wide (eight terms: LLAMA_SHAPES)
    'phi3/eager/fp32/0': (40.228, 3.991, 3.999, 10.879, 0.455, 0.023, 16.013, 0.031),
    'phi3/eager/fp32/1': (4.134, -0.007, 4.002, 11.061, 4.331, 0.051, -0.018, -0.008),
    'phi3/eager/autocast_bf16/0': (28.405, 5.987, 3.992, 8.633, 0.667, 2.053, 7.99, -0.073),
    'phi3/eager/autocast_bf16/1': (4.087, -0.025, 4.167, 8.922, 5.094, 0.585, -0.208, -0.169),
    'phi3/eager/bf16/0': (24.319, 5.988, 3.994, 7.892, 0.385, -0.034, 8.026, -0.045),
    'phi3/eager/bf16/1': (2.073, -0.0, 4.004, 8.517, 1.962, -0.016, -0.03, -0.019),
    'phi3/sdpa/fp32/0': (40.466, -0.015, 3.993, 11.039, 0.753, 0.015, 15.918, 12.05),
    'phi3/sdpa/fp32/1': (4.17, -0.01, 3.99, 11.846, 0.465, 0.0, -0.021, -0.054),
    'phi3/sdpa/autocast_bf16/0': (28.347, -0.004, 3.983, 9.074, 1.014, 2.054, 7.915, 5.965),
    'phi3/sdpa/autocast_bf16/1': (3.914, -0.017, 4.174, 9.586, 0.763, 0.569, -0.193, -0.126),
    'phi3/sdpa/bf16/0': (24.223, -0.002, 4.001, 7.566, 0.412, 0.001, 7.997, 5.951),
    'phi3/sdpa/bf16/1': (1.981, 0.003, 3.997, 7.901, 0.204, 0.007, 0.005, 0.004),
},
    "cuda": {  # no KV cache (rows measured with it have it taken off), SDPA without a b·a·s² term but fp32 with GQA
        'gpt2/sdpa/fp32/0': (112.074, 0.0, 4.005, 7.765, -0.005, 0.004),
        'gpt2/sdpa/fp32/1': (4.008, 0.0, 4.002, 7.843, -0.012, 0.005),
        'gpt2/sdpa/autocast_bf16/0': (84.046, 0.0, 4.004, 5.955, 0.012, 2.004),
        'gpt2/sdpa/autocast_bf16/1': (1.5, 0.0, 4.267, 5.075, 0.111, 0.857),
        'gpt2/sdpa/bf16/0': (56.075, 0.0, 4.006, 3.808, -0.021, 0.003),
        'gpt2/sdpa/bf16/1': (2.019, 0.0, 4.006, 4.252, -0.263, -0.007),
        'gpt2/eager/fp32/0': (112.002, 4.002, 4.001, 7.975, -0.124, 0.004),
        'gpt2/eager/fp32/1': (3.983, 0.002, 4.002, 7.933, 3.894, 0.006),
        'gpt2/eager/autocast_bf16/0': (83.961, 6.002, 4.001, 6.118, -0.142, 2.005),
        'gpt2/eager/autocast_bf16/1': (1.224, 0.028, 4.257, 7.024, 2.457, 0.813),
        'gpt2/eager/bf16/0': (55.982, 2.001, 4.001, 4.037, -0.065, 0.005),
        'gpt2/eager/bf16/1': (1.985, 0.002, 4.001, 3.971, 1.885, 0.005),
        'bloom/eager/fp32/0': (64.0, 4.002, 4.002, 11.937, -0.114, 0.005),
        'bloom/eager/fp32/1': (3.973, 0.003, 4.001, 12.103, 3.808, 0.004),
        'bloom/eager/autocast_bf16/0': (36.005, 6.0, 4.0, 10.049, 0.009, 2.004),
        'bloom/eager/autocast_bf16/1': (1.212, 0.029, 4.257, 11.156, 2.38, 0.812),
        'bloom/eager/bf16/0': (32.003, 6.002, 4.001, 5.981, -0.126, 0.004),
        'bloom/eager/bf16/1': (1.964, 0.001, 4.002, 6.144, 1.882, 0.004),
        # Llama (SDPA): fp32 with GQA keeps the math kernel's attention probabilities (keeps_attention_scores)
        'llama/sdpa/autocast_bf16/0': (32.59, 0.0, 4.018, 3.996, -0.016, 2.042, 7.642, 3.825),
        'llama/sdpa/autocast_bf16/1': (2.693, 0.0, 4.272, 8.968, 0.12, 0.879, -0.347, -0.482),
        'llama/sdpa/bf16/0': (20.685, 0.0, 4.013, 6.98, 0.016, 0.006, 7.882, 3.787),
        'llama/sdpa/bf16/1': (1.952, 0.0, 4.002, 7.903, 0.026, 0.008, 0.014, 0.009),
        'llama/sdpa/fp32/0': (39.97, 3.998, 4.003, 11.823, 0.162, 0.01, 16.012, 0.033),
    },
}
# What dropout adds to a step's kept activations (hidden and attention dropout on: RunPlan.dropout), bytes per element
# of each feature as above, by device and mode: the masks its backward needs, and the dropped probabilities where a
# matmul keeps them beside the softmax's output. Fitted on CPU (calibrate_activations.py --dropout), where torch's
# dropout is not fused - it keeps its scaled noise, in the dropped tensor's dtype - and SDPA's kernels take no dropout,
# so torch runs its math kernel, which keeps the probabilities in fp32. A device without a table counts them
# (counted_dropout), as CUDA's kernels keep them: the fused dropout a 1-byte mask (DROPOUT_MASK_BYTES), SDPA's flash and
# memory-efficient kernels none (their backward draws the mask again from the generator's seed).
DROPOUT_COEFFICIENTS: dict[str, dict[str, tuple[float, ...]]] = {"cpu": {
    'bloom/eager/autocast_bf16/0': (4.0, 2.011, 0.0, -0.518, 0.0, 0.0),
    'bloom/eager/bf16/0': (4.077, 1.988, 0.0, 0.343, 0.0, 0.0),
    'bloom/eager/fp32/0': (8.055, 8.0, 0.0, -0.094, 0.0, 0.0),
    'gemma3/eager/autocast_bf16/0': (-0.174, 3.993, 0.0, -0.649, 0.0, 0.0, 0.077, -0.256, 0.276),
    'gemma3/eager/bf16/0': (-0.109, 2.007, 0.0, 0.979, 0.0, 0.0, -0.059, 0.078, -0.052),
    'gemma3/eager/fp32/0': (-0.314, 8.005, 0.0, 0.661, 0.0, 0.0, 0.055, -0.033, 0.027),
    'gemma3/sdpa/autocast_bf16/0': (-0.194, 11.982, 0.0, 0.544, 0.0, 0.0, 0.089, -4.132, 10.05),
    'gemma3/sdpa/bf16/0': (-0.199, 11.992, 0.0, 0.567, 0.0, 0.0, 0.053, -4.448, 10.218),
    'gemma3/sdpa/fp32/0': (-0.288, 12.003, 0.0, 0.794, 0.0, 0.0, 0.032, -8.024, 8.009),
    'gpt2/eager/autocast_bf16/0': (4.022, 1.989, 0.0, 4.723, 0.0, 0.0),
    'gpt2/eager/bf16/0': (4.031, 3.999, 0.0, 2.1, 0.0, 0.0),
    'gpt2/eager/fp32/0': (8.053, 8.0, 0.0, 3.922, 0.0, 0.0),
    'gpt2/sdpa/autocast_bf16/0': (10.122, 11.985, 0.0, 4.408, 0.0, 0.0),
    'gpt2/sdpa/bf16/0': (10.106, 11.999, 0.0, 1.64, 0.0, 0.0),
    'gpt2/sdpa/fp32/0': (8.035, 12.0, 0.0, 4.086, 0.0, 0.0),
    'llama/eager/autocast_bf16/0': (0.08, 4.006, 0.0, -0.308, 0.0, 0.0, -0.018, 0.073, -0.031),
    'llama/eager/bf16/0': (-0.056, 2.012, 0.0, 0.268, 0.0, 0.0, -0.047, -0.007, 0.042),
    'llama/eager/fp32/0': (0.084, 7.999, 0.0, -0.628, 0.0, 0.0, 0.042, -0.134, 0.056),
    'llama/sdpa/autocast_bf16/0': (0.354, 11.991, 0.0, 0.031, 0.0, 0.0, -0.076, -3.753, 9.86),
    'llama/sdpa/bf16/0': (0.103, 11.979, 0.0, -0.341, 0.0, 0.0, 0.015, -4.086, 10.151),
    'llama/sdpa/fp32/0': (-0.001, 11.999, 0.0, -0.2, 0.0, 0.0, 0.033, -8.022, 8.004),
    'olmo2/eager/autocast_bf16/0': (0.288, 1.983, 0.0, -0.443, 0.0, 0.0, -0.038, 0.13),
    'olmo2/eager/bf16/0': (-0.112, 1.991, 0.0, -0.533, 0.0, 0.0, 0.099, 0.074),
    'olmo2/eager/fp32/0': (-0.0, 8.0, 0.0, 0.522, 0.0, 0.0, -0.03, -0.081),
    'olmo2/sdpa/autocast_bf16/0': (10.146, 11.998, 0.0, 0.384, 0.0, 0.0, -0.049, -4.026),
    'olmo2/sdpa/bf16/0': (10.283, 11.988, 0.0, -0.141, 0.0, 0.0, -0.03, -3.982),
    'olmo2/sdpa/fp32/0': (7.687, 12.001, 0.0, 1.334, 0.0, 0.0, 0.012, -8.101),
    'phi3/eager/autocast_bf16/0': (4.195, 3.988, 0.0, 0.194, 0.0, 0.0, 0.009, -0.183),
    'phi3/eager/bf16/0': (3.907, 2.013, 0.0, -0.0, 0.0, 0.0, 0.011, -0.023),
    'phi3/eager/fp32/0': (8.138, 7.998, 0.0, 0.161, 0.0, 0.0, 0.006, -0.235),
    'phi3/sdpa/autocast_bf16/0': (10.243, 12.0, 0.0, -0.386, 0.0, 0.0, -0.063, -5.882),
    'phi3/sdpa/bf16/0': (10.175, 11.999, 0.0, -0.038, 0.0, 0.0, -0.026, -6.075),
    'phi3/sdpa/fp32/0': (8.127, 12.001, 0.0, -0.174, 0.0, 0.0, -0.036, -11.962),
    'qwen3/eager/autocast_bf16/0': (0.184, 3.993, 0.0, -0.96, 0.0, 0.0, 0.013, 0.026, 0.075),
    'qwen3/eager/bf16/0': (0.096, 2.005, 0.0, -0.557, 0.0, 0.0, 0.01, 0.021, -0.009),
    'qwen3/eager/fp32/0': (0.072, 8.0, 0.0, -0.278, 0.0, 0.0, 0.009, -0.115, 0.053),
    'qwen3/sdpa/autocast_bf16/0': (-0.157, 11.995, 0.0, -0.702, 0.0, 0.0, 0.02, -4.311, 10.374),
    'qwen3/sdpa/bf16/0': (-0.149, 11.997, 0.0, -0.291, 0.0, 0.0, 0.027, -4.035, 10.186),
    'qwen3/sdpa/fp32/0': (-0.018, 11.996, 0.0, 0.268, 0.0, 0.0, -0.018, -7.593, 7.824),
}}
DROPOUT_MASK_BYTES = {"cpu": None, "cuda": 1}  # None: torch's CPU dropout keeps its noise, in the dropped tensor's dtype


def counted_dropout(shape: ModelShape, mode: str, device: str) -> tuple[float, ...]:
    """What dropout adds, in bytes per element of each activation feature, counted tensor by tensor: a mask per
    element of each of the family's dropout_sites (a block's b·s·h outputs - not kept otherwise: a residual add keeps
    nothing - and the embeddings' sum), and - where the attention keeps its probabilities - their mask and the dropped
    probabilities the next matmul keeps, unless they take the place of a cast copy it would keep anyway (a softmax in
    fp32 cast to 16 bits: autocast's, and BLOOM's and Llama's in bf16). Under checkpointing a block keeps its input
    alone. On CPU (DROPOUT_MASK_BYTES None) a mask is the noise in the dropped tensor's dtype - the probabilities' are
    fp32 where autocast leaves the queries in fp32 (Family.autocast_fp32_queries) - and the count of the eager modes is
    checked against the CPU fit (tests/test_memory.py)."""
    fam, _, compute, checkpointing = mode.split("/")
    spec = family(fam)
    layer_sites, embedding_sites = spec.dropout_sites
    value = 4 if compute == "fp32" else 2  # a block's outputs and the probabilities' dtype (autocast: its matmuls')
    embedding = 2 if compute == "bf16" else 4  # the embeddings' sum (autocast leaves embeddings in fp32)

    def mask(dropped: int) -> float:
        return dropped if DROPOUT_MASK_BYTES.get(device) is None else DROPOUT_MASK_BYTES[device]

    per_bsh = per_scores = 0.0
    if checkpointing == "0":
        per_bsh = layer_sites * mask(value)
        if keeps_attention_scores(shape, mode, device):
            probabilities = 4 if compute == "autocast_bf16" and spec.autocast_fp32_queries else value
            own_copy = compute == "fp32" or (compute == "bf16" and not spec.softmax_fp32)
            per_scores = mask(probabilities) + (probabilities if own_copy else 0)
    coefficients = [per_bsh, per_scores, 0.0, embedding_sites * mask(embedding), 0.0, 0.0]
    return tuple(coefficients + [0.0] * (len(activation_features(shape, 1, 1)) - len(coefficients)))


def dropout_coefficients(shape: ModelShape, mode: str, device: str) -> tuple[tuple[float, ...], str]:
    """(what dropout adds per element of each feature, where that comes from): the device's fit, else the count."""
    row = fitted_row(DROPOUT_COEFFICIENTS.get(device, {}), mode, shape)
    if row is not None:
        return row, f", dropout's masks as measured ({device})"
    return counted_dropout(shape, mode, device), f", dropout's masks counted (not measured on {device})"


# Under activation checkpointing the backward recomputes one block at a time: the step's peak is then the larger of
# the logits' gradients and one block's full activations plus what its backward holds beside them, per b·s·h element
# and per b·a·s² element (eager attention's score gradients; SDPA keeps no score matrix: 0), fitted per CUDA mode by
# calibrate_activations.recompute_term; a mode without CUDA rows takes the first fit's 34.1.
RECOMPUTE_GRADIENT_BYTES = {"cpu": {}, "cuda": {
    "bloom/eager/autocast_bf16/1": (22.0, 5.75), "bloom/eager/bf16/1": (9.8, 6.0), "bloom/eager/fp32/1": (26.3, 6.5),
    "gpt2/eager/autocast_bf16/1": (1.8, 3.75), "gpt2/eager/bf16/1": (34.7, 0.0), "gpt2/eager/fp32/1": (2.6, 4.75),
    "gpt2/sdpa/autocast_bf16/1": (40.1, 0.0), "gpt2/sdpa/bf16/1": (7.9, 0.0), "gpt2/sdpa/fp32/1": (28.2, 0.0),
    "llama/sdpa/autocast_bf16/1": (21.9, 0.0), "llama/sdpa/bf16/1": (20.8, 0.0)}}
RECOMPUTE_GRADIENT_DEFAULT = {"cpu": (0.0, 0.0), "cuda": (34.1, 0.0)}
# torch.compile keeps fewer tensors (inductor fuses the cross-entropy and elementwise chains): a factor on the eager
# estimate per mode (calibrate_activations.fit_compiled over the CUDA grid's compiled rows), keyed by what the measured
# step's forward handed back: "returned" (the logits beside the loss) or "loss_only" (hfscale's training forward,
# run/forward.py). A loss-only step without a figure of its own takes the returned one, an upper bound (the logits'
# gradient is one more tensor to hold), and says so; a mode without compiled rows takes the factor of two compiled
# whole runs. No compiled CPU step was measured: there the eager estimate stands.
STEP_OUTPUTS = ("returned", "loss_only")
COMPILED_ACTIVATION_FACTOR = {"cuda": {
    "returned": {"gpt2/sdpa/autocast_bf16/0": 0.497, "gpt2/sdpa/bf16/0": 0.554, "gpt2/sdpa/fp32/0": 0.696},
    "loss_only": {"gpt2/sdpa/autocast_bf16/0": 0.472, "gpt2/sdpa/bf16/0": 0.556, "gpt2/sdpa/fp32/0": 0.661,
                  "llama/sdpa/autocast_bf16/0": 0.639, "llama/sdpa/bf16/0": 0.65}}}
COMPILED_FACTOR_FALLBACK = {"cuda": 0.51}
# ... and adds, at the start of the backward, bytes per b·s·V logit element, by the bytes of the logits the model
# returns (2: autocast and bf16; 4: fp32) and by whether the vocabulary's rows are a multiple of inductor's 128-byte
# stride alignment (64 two-byte elements), where eager adds two fp32 copies (LOGITS_PEAK_COPIES): fitted by
# calibrate_activations.fit_compiled (ragged rows) and from whole runs (aligned); scaling the eager peak by the factor
# instead put the grid's peaks 10-16% under, where the logits weigh most.
COMPILED_LOGITS_PEAK_BYTES = {"cuda": {"returned": {"ragged": {2: 6.0, 4: 8.0}, "aligned": {2: 1.1}},
                                       "loss_only": {"ragged": {2: 4.0, 4: 0.4}, "aligned": {2: 0.0}}}}
COMPILED_ALIGNMENT_ELEMENTS = 64  # inductor pads strides to 128 bytes: 64 two-byte elements
LOGITS_PEAK_COPIES = 2  # at the start of the backward: the logits' gradient and log-softmax's, both fp32
# transformers' GPT-2 and BLOOM build a KV cache in every forward unless passed use_cache=False, training included:
# with SDPA, 2 x the compute dtype's bytes per layer b·s·h beside what SDPA saves (eager attention copies the keys and
# values anyway; checkpointing turns the cache off). hfscale trains without it (run/forward.py). A device whose table
# was fitted on steps that kept it is listed here, and has it taken off; none is (rows measured with it are corrected
# before the fit, calibrate_activations.without_kv_cache).
FITTED_WITH_KV_CACHE: tuple[str, ...] = ()


def tp_activation_scales(tp: int, checkpointing: bool) -> tuple[float, float]:
    """What a TP rank keeps of the per-layer activation features (the blocks' b·s·h terms, their b·a·s² attention
    terms) against the whole model's, by Korthikanti et al. (2022, Table 2; formulas/parallel3d.py) without sequence
    parallelism: of the 34·sbh a layer keeps, the 24·sbh of the matmul inputs split over TP and the LayerNorms' and
    dropouts' 10·sbh stay whole; the attention scores, softmax and dropout (5·as²b) split. The logits, the embedding
    output and the masks stay whole (hfscale gathers the vocabulary-parallel logits for the loss). Under activation
    checkpointing a block keeps its input alone, whole on every rank."""
    if tp == 1 or checkpointing:
        return 1.0, 1.0
    return (10 + 24 / tp) / 34, 1 / tp


def activation_features(shape: ModelShape, seq: int, micro_batch: int) -> list[int]:
    """The element counts ACTIVATION_COEFFICIENTS multiply (bytes per element), in ACTIVATION_FEATURES order: six,
    nine for a family with MLP, key/value and query widths of their own. The weight matrices are those a forward
    multiplies by (the blocks' and the head's: autocast casts each)."""
    b, s, h, l = micro_batch, seq, shape.hidden, shape.n_layer
    spec = shape.spec
    block_matrices = sum(d[0] * d[1] for _, d in spec.block_tensors(shape) if len(d) == 2)
    features = [l * b * s * h, l * b * shape.n_head * s * s, b * s * shape.vocab, b * s * h, b * s * s,
                l * block_matrices + shape.vocab * h]
    if spec.own_widths:
        features += [l * b * s * shape.ffn_size, l * b * s * shape.kv_hidden, l * b * s * shape.q_hidden]
    return features


def fitted_row(table: dict, mode: str, shape: ModelShape) -> tuple[float, ...] | None:
    """`mode`'s coefficients in `table` for `shape`, or None: not measured, or fitted on shapes whose queries were h
    wide (a row shorter than the features: its b·s·h term holds the queries' tensors) while this shape's are not."""
    row = table.get(mode)
    missing = 0 if row is None else len(activation_features(shape, 1, 1)) - len(row)
    if row is None or (missing and shape.q_hidden != shape.hidden):
        return None
    return tuple(row) + (0.0,) * missing


def chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """The fused linear cross-entropy's tokens per chunk (run/forward.py): a chunk's logits about the size of the whole
    micro-batch's hidden states (vocab/hidden chunks, as Liger-Kernel sizes them), a power of two."""
    chunks = max(1, ceil(vocab / hidden))
    return 1 << max(0, ceil(log2(max(1, ceil(tokens / chunks)))))


def fused_loss_bytes(shape: ModelShape, seq: int, micro_batch: int, mode: str) -> tuple[int, int]:
    """(kept from the forward to the backward, the most above that while it runs) of the fused linear cross-entropy
    (run/forward.py) in an activation mode. Kept: the hidden states' gradient (b·s·h, compute dtype) and the head's
    (V·h, fp32). In its forward: one chunk's logits in fp32; computing in bf16, also their bf16 matmul output, the
    gradient's bf16 copy and the head's chunk gradient with its fp32 promotion before the sum (V·h x (2 + 4); in fp32
    it is summed in place); under autocast the head's bf16 copy (V·h). In its backward: the two gradients scaled, the
    head's in fp32 then in the weights' dtype."""
    v, h, bsh = shape.vocab, shape.hidden, micro_batch * seq * shape.hidden
    compute = mode.split("/")[2]
    compute_bytes, weight_bytes = (4, 4) if compute == "fp32" else (2, 2) if compute == "bf16" else (2, 4)
    chunk = min(chunk_tokens(micro_batch * seq, v, h), micro_batch * seq)
    kept = compute_bytes * bsh + 4 * v * h
    forward = chunk * v * 4 + (2 * compute_bytes * chunk * v + (compute_bytes + 4) * v * h if compute != "fp32" else 0)
    forward += 2 * v * h if compute.startswith("autocast") else 0
    backward = compute_bytes * bsh + (4 + (weight_bytes if weight_bytes < 4 else 0)) * v * h
    return kept, max(forward, backward)


def activation_mode(family_name: str, attention: str, compute: str, checkpointing: bool) -> str:
    """`compute`: fp32 | autocast_bf16 (DDP's autocast over fp32 weights) | bf16 (DeepSpeed's and FSDP2's bf16 module).
    flash_attention_2 keeps no s x s matrix, like SDPA; a family without SDPA (BLOOM) runs eager attention. None is
    transformers' own choice: SDPA where the family has it (RunPlan.attention)."""
    spec = family(family_name)
    attn = "eager" if not spec.sdpa or attention == "eager" else "sdpa"
    compute = "bf16" if compute == "fp16" else "autocast_bf16" if compute == "autocast_fp16" else compute
    return f"{spec.activations_as or spec.name}/{attn}/{compute}/{int(checkpointing)}"


def keeps_attention_scores(shape: ModelShape, mode: str, device: str) -> bool:
    """Whether a step's attention keeps its b·a·s² probabilities for the backward. Eager attention does; SDPA's flash
    and memory-efficient kernels do not - except on CUDA in fp32 with grouped-query attention, which neither takes
    (flash computes in 16 bits, the memory-efficient kernel has no `enable_gqa`, which transformers passes), so torch
    runs its math kernel and keeps them: 4.0 bytes per element in the H200 rows (docs/estimate.md)."""
    attention, compute = mode.split("/")[1:3]
    if attention != "sdpa":
        return True
    return device == "cuda" and compute == "fp32" and shape.kv_heads < shape.n_head


def window_caveat(shape: ModelShape, seq: int, attention: str) -> str | None:
    """What the activation terms leave out when a model's windowed layers see less than the sequence, or None. Every
    calibration sequence lay within the window, where a windowed layer keeps what a global one does. Beyond it
    transformers hands SDPA an explicit mask instead of its causal flag, and on CPU each such layer kept 1.7-2.5 bytes
    per b·a·s² more in fp32 - not linear in it, so not fitted; eager attention kept the same either way; CUDA
    unmeasured (docs/models.md)."""
    if attention != "sdpa" or not shape.window_shorter_than(seq):
        return None
    return (f"{shape.spec.windowed_layers(shape)} of the {shape.n_layer} layers attend over a {shape.window:,}-token "
            f"window, shorter than the sequence ({seq:,}): there SDPA is handed an explicit mask, and what it keeps "
            f"beyond the activation terms (measured within the window) is not estimated - on CPU 1.7-2.5 bytes per "
            f"b·a·s² per such layer in fp32, on CUDA unmeasured (docs/models.md)")


def kv_cache_bytes(shape: ModelShape, seq: int, micro_batch: int, mode: str) -> int:
    """What transformers' KV cache adds to a training step's kept tensors in `mode` (FITTED_WITH_KV_CACHE)."""
    _, attention, compute, checkpointing = mode.split("/")
    if attention != "sdpa" or checkpointing == "1":
        return 0
    return 2 * (4 if compute == "fp32" else 2) * shape.n_layer * micro_batch * seq * shape.hidden


@dataclass(frozen=True)
class Activations:
    kept: int  # after the forward
    peak: int  # at the start of the backward
    backward_end: int  # under checkpointing: alive beside every gradient when the last block is recomputed (else 0)
    calibration: str


def logits_bytes(mode: str) -> int:
    """The bytes of one logit element the model returns in `mode` (family/attention/precision/...): 4 where it computes
    in fp32, else 2 (bf16 weights, or autocast's bf16 head)."""
    return 4 if mode.split("/")[2] == "fp32" else 2


def compiled_figure(table: dict, output: str, pick) -> tuple[object, str | None]:
    """(a figure, the step output it was measured with) from a compiled table keyed by STEP_OUTPUTS: `pick` reads it
    from the output's own table, else from the returned-logits one (an upper bound for the loss alone); (None, None)
    when neither has it."""
    for measured in dict.fromkeys((output, "returned")):
        value = pick(table.get(measured) or {})
        if value is not None:
            return value, measured
    return None, None


def activations(shape: ModelShape, seq: int, micro_batch: int, mode: str, device: str = "cpu", compiled: bool = False,
                tp: int = 1, fused_loss: bool = False, kv_cache: bool = False,
                logits_output: bool = False, float8: bool = False, dropout: bool = False) -> Activations:
    """What one micro-batch on `device` keeps after the forward, the step's peak, and (under checkpointing) what the
    backward holds at its end, on one rank of a TP group of `tp` (tp_activation_scales), with which calibration gave
    them. `fused_loss`: the fused linear cross-entropy replaces the logits' terms (fused_loss_bytes). `kv_cache`: the
    step keeps transformers' KV cache (hfscale's runs never do since run/forward.py; runs measured before did).
    `logits_output`: the step's forward returns the logits beside the loss (hfscale's never does since run/forward.py;
    the compiled figures say which they were measured with). `dropout`: the model's hidden and attention dropout are
    on, and their masks kept (dropout_coefficients; the probabilities' split over TP, the masks of the blocks' outputs
    whole on every rank, as Korthikanti et al. count them). `float8` (--fp8): the blocks' converted layers cast their
    fp32 weights to float8 themselves, so autocast keeps no bf16 copy of those (their inputs are kept in bf16 as a
    bf16 layer's are); the peak adds one layer's float8 operands in flight (float8_operand_bytes, not measured yet).

    The end of a checkpointed backward: the last block recomputed, with its backward's gradients, and what the forward
    kept but the loss's share (the logits, or the fused loss's buffers - its head gradient is by then a parameter's
    gradient), while all the parameters' gradients exist. Measured on CPU with the fused loss, where no logits hide
    it: 0.96-1.07 of the step's peak (4 probe rows and a whole run)."""
    table, calibration = ACTIVATION_COEFFICIENTS.get(device, {}), device
    coefficients = fitted_row(table, mode, shape)
    if coefficients is None:  # no measurement of this mode (or shape) on this device (yet): the CPU fit, and say so
        apart = f" with queries {shape.q_hidden} wide, apart from h" if mode in table else ""
        table, calibration = ACTIVATION_COEFFICIENTS["cpu"], f"cpu (no {device} measurement of {mode}{apart})"
        coefficients = fitted_row(table, mode, shape)
    if coefficients is None:
        raise ValueError(f"no activation calibration for {mode!r}; known: {', '.join(table)}")
    cache_in_fit = calibration == device and device in FITTED_WITH_KV_CACHE
    feats = activation_features(shape, seq, micro_batch)
    linear, attention = tp_activation_scales(tp, mode.endswith("/1"))
    scores = keeps_attention_scores(shape, mode, device if calibration == device else "cpu")
    feats[0], feats[1] = feats[0] * linear, feats[1] * attention * scores
    for width in range(6, len(feats)):  # a block's MLP, key/value and query tensors: column-parallel outputs, split
        feats[width] *= 1 if linear == 1 else 1 / tp
    feats[5] /= tp  # autocast's weight copies: of this rank's slices (every block matrix and the head are split)
    if tp > 1:
        calibration += f", per-layer terms x {linear:.3f} / x {attention:.3f} under TP {tp} (Korthikanti et al. 2022)"
    kept = sum(c * x for c, x in zip(coefficients, feats))
    block_dropout = None  # what a recomputed block's masks add: the uncheckpointed mode's, per layer
    if dropout:
        masks, note = dropout_coefficients(shape, mode, device)  # the device's kernels, whichever fit the rest is
        split = activation_features(shape, seq, micro_batch)
        split[1] /= tp
        split[6:] = [x / tp for x in split[6:]]
        kept += sum(c * x for c, x in zip(masks, split))
        if mode.endswith("/1"):
            block_dropout = dropout_coefficients(shape, mode[:-1] + "0", device)[0]
        calibration += note
    cache = kv_cache_bytes(shape, seq, micro_batch, mode) / tp  # the keys and values split over a TP group's ranks
    if kv_cache != cache_in_fit and cache:
        kept += cache if kv_cache else -cache
        calibration += ", with the KV cache" if kv_cache else ", the KV cache of the fit's steps taken off"
    peak_extra = LOGITS_PEAK_COPIES * 4 * micro_batch * seq * shape.vocab
    loss_share = coefficients[2] * feats[2]  # the fp32 logits
    fused_kept = fused_running = 0  # the fused loss's own: torch.compile cannot drop the gradients its forward makes
    if fused_loss:
        fused_kept, fused_running = fused_loss_bytes(shape, seq, micro_batch, mode)
        # the logits' terms out, and the head's share of the weight copies autocast keeps (the loss casts its own)
        kept += fused_kept - loss_share - coefficients[5] * shape.vocab * shape.hidden
        peak_extra, loss_share = 0, fused_kept
        calibration += ", fused loss: the logits' terms replaced by its own (fused_loss_bytes)"
    float8_peak = 0
    if float8:
        kept -= coefficients[5] * shape.n_layer * float8_block_elements(shape, tp) if "autocast" in mode else 0
        float8_peak = float8_operand_bytes(micro_batch * seq, block_linears(shape, tp))
        calibration += ", float8: no autocast copies of the converted weights, one layer's float8 operands at the peak"
    backward_end = 0.0
    if mode.endswith("/1"):  # the backward recomputes one block's full activations at a time, with its gradients
        one_block = recomputed_block_bytes(shape, seq, micro_batch, mode, device, table, block_dropout)
        peak_extra = max(peak_extra, one_block)
        backward_end = kept - loss_share + one_block
    factor = 1.0
    if compiled and device in COMPILED_ACTIVATION_FACTOR:
        factor, peak_extra, note = compiled_step(shape, seq, micro_batch, mode, device, peak_extra, fused_loss,
                                                 logits_output)
        calibration += note
    kept = (kept - fused_kept) * factor + fused_kept
    return Activations(int(kept), int(kept + max(peak_extra, fused_running) + float8_peak), int(backward_end * factor),
                       calibration)


def recomputed_block_bytes(shape: ModelShape, seq: int, micro_batch: int, mode: str, device: str,
                           table: dict, dropout: tuple[float, ...] | None = None) -> float:
    """What a checkpointed backward holds for the block it recomputes: the block's full activations (the mode's
    uncheckpointed coefficients in `table`, the calibration the step's figures come from, per b·s·h and per b·a·s²
    element), its backward's gradients beside them (RECOMPUTE_GRADIENT_BYTES), and with dropout its masks (`dropout`:
    the uncheckpointed mode's dropout_coefficients)."""
    full = fitted_row(table, mode[:-1] + "0", shape) or fitted_row(ACTIVATION_COEFFICIENTS["cpu"], mode[:-1] + "0",
                                                                   shape)
    per_bsh, per_scores = RECOMPUTE_GRADIENT_BYTES.get(device, {}).get(
        mode, RECOMPUTE_GRADIENT_DEFAULT.get(device, (0.0, 0.0)))
    bsh = micro_batch * seq * shape.hidden
    widths = sum(c * x / shape.n_layer for c, x in zip(full[6:], activation_features(shape, seq, micro_batch)[6:]))
    scores = keeps_attention_scores(shape, mode, device)
    masks = dropout or (0.0,) * len(full)
    widths += sum(c * x / shape.n_layer for c, x in zip(masks[6:], activation_features(shape, seq, micro_batch)[6:]))
    return ((full[0] + per_bsh + masks[0]) * bsh
            + (full[1] * scores + per_scores + masks[1]) * micro_batch * shape.n_head * seq * seq + widths)


def compiled_step(shape: ModelShape, seq: int, micro_batch: int, mode: str, device: str, peak_extra: float,
                  fused_loss: bool, logits_output: bool) -> tuple[float, float, str]:
    """(the factor torch.compile keeps of the eager activations, the step's peak above them, the calibration's note)
    on `device`, from the figures measured with the step's own output (COMPILED_*; a loss-only step without its own
    takes the returned one's, an upper bound). The peak: the eager one scaled by the factor, or - unless the loss is
    fused - the measured bytes per logit where larger (a checkpointed step's recomputed block can be)."""
    output = "returned" if logits_output else "loss_only"
    factor, measured = compiled_figure(COMPILED_ACTIVATION_FACTOR[device], output, lambda by_mode: by_mode.get(mode))
    upper_bound = measured not in (None, output)  # a loss-only step's figure measured with the logits returned
    if factor is None:
        factor = COMPILED_FACTOR_FALLBACK[device]
        note = f", x {factor:g} compiled (two whole runs' factor: no compiled row of {mode})"
    else:
        note = f", x {factor:g} compiled"
    peak_extra *= factor
    if not fused_loss and device in COMPILED_LOGITS_PEAK_BYTES:  # the larger of the logits' and a block's share
        itemsize = logits_bytes(mode)
        rows = "aligned" if shape.vocab % COMPILED_ALIGNMENT_ELEMENTS == 0 else "ragged"
        per_logit, peak_measured = compiled_figure(
            COMPILED_LOGITS_PEAK_BYTES[device], output,
            lambda by_rows: (by_rows.get(rows) or {}).get(itemsize, (by_rows.get("ragged") or {}).get(itemsize)))
        if per_logit is not None:
            peak_extra = max(per_logit * micro_batch * seq * shape.vocab, peak_extra if mode.endswith("/1") else 0.0)
            upper_bound = upper_bound or peak_measured != output
    if upper_bound:
        note += "; measured with the logits returned: an upper bound for the loss alone"
    return factor, peak_extra, note
