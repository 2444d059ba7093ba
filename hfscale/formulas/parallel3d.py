"""Tensor x pipeline x data parallelism - Megatron-LM's 3D layout, the one BigScience trained BLOOM with through
Megatron-DeepSpeed: memory per GPU and time per step before launch. Pure functions, no torch.

A grid of T x P x D GPUs: tensor parallelism (TP, T) splits every block's matrices over the GPUs of one node;
pipeline parallelism (PP, P) gives each of P stages L/P consecutive blocks; data parallelism (DP, D) replicates the
pipeline. Megatron orders ranks TP fastest, then DP, then PP: a stage is T x D consecutive ranks.

Sources (docs/project.md says how close each check came):
- activations per layer: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv 2205.05198), Table 2: sbh(34 + 5as/h) bytes without parallelism, 16-bit activations, 1-byte dropout masks;
  counted tensor by tensor as the paper counts them, for other widths (SwiGLU, grouped-query attention, no dropout);
- the 1F1B pipeline schedule: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM" (arXiv 2104.04473): the first stage keeps P micro-batches in flight, the bubble is
  (P - 1) of the M + P - 1 micro-batch slots of a step, each block all-reduces its activations twice in the forward
  and twice in the backward over TP. Its interleaved schedule (section 2.2.2: V model chunks a GPU) cuts the bubble
  to (P - 1) / V slots for V times the point-to-point sends; its warm-up (Megatron-Core's
  forward_backward_pipelining_with_interleaving: 2 (P - stage - 1) + (V - 1) P chunk forwards before the first
  backward) keeps 1 + (P - 1) / (P V) of 1F1B's activations on the first stage (Korthikanti et al., section 4.2.3);
- context parallelism (Megatron-Core's --context-parallel-size, CP): each sequence split over CP GPUs in 2 CP
  load-balanced chunks, every GPU's queries attending to keys and values passed around a ring of the CP GPUs
  (CP - 1 sends a layer in the forward, keys and values and their gradients in the backward) under its own
  attention's compute; the gradients reduced over DP x CP.
"""

from dataclasses import dataclass, replace
from math import ceil, prod

from .comm import RING, Links, collective_s
from .memory import ADAMW_STATE_BYTES, DTYPE_BYTES, MASTER_BYTES, OPTIMIZER_STEP_BYTES, RankMemory
from .metrics import ModelShape, forward_flops_per_sequence, global_batch_size
from .precision import storage_dtype
from .tensors import parameter_tensors

RECOMPUTE = ("none", "selective", "full")  # Megatron's --recompute-granularity (none: no recomputation)
MEGATRON_DROPOUT = 0.1  # Megatron-LM's --hidden-dropout and --attention-dropout defaults
VOCAB_DIVISIBLE_BY = 128  # Megatron's --make-vocab-size-divisible-by: the vocabulary is padded to 128 x TP
TP_ALL_REDUCES = {"none": 4, "selective": 4, "full": 6}  # per block per micro-batch: 2 forward + 2 backward, and full
# recomputation runs the forward (its 2) again


@dataclass(frozen=True)
class Grid:
    """A 3D layout: TP x PP x DP GPUs."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    sequence_parallel: bool = False  # Korthikanti et al.: the LayerNorms and dropouts split over TP along the sequence
    zero1: bool = False  # the fp32 masters and optimizer states sharded over DP (Megatron-DeepSpeed's ZeRO-1)
    # Megatron-LM needs PP to divide the layers; Megatron-DeepSpeed's PipelineModule also cuts them unevenly (BLOOM:
    # 70 layers on 12 stages), and its busiest stage then holds ceil(L / PP)
    uneven_stages: bool = False
    cp: int = 1  # context parallelism: each sequence's tokens split over CP GPUs (ranks ordered TP, CP, DP, PP)
    vp: int = 1  # model chunks per GPU: Megatron's interleaved 1F1B (--virtual-pipeline-model-parallel-size)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def reducers(self) -> int:
        """The GPUs a gradient is reduced over (and ZeRO-1 shards the optimizer over): DP x CP."""
        return self.dp * self.cp

    @property
    def label(self) -> str:
        return (f"tp{self.tp}-pp{self.pp}" + (f"-vp{self.vp}" if self.vp > 1 else "")
                + (f"-cp{self.cp}" if self.cp > 1 else "") + f"-dp{self.dp}"
                + ("-sp" if self.sequence_parallel and self.tp > 1 else ""))


def padded_vocab(vocab: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of 128 x TP (each TP rank keeps an equal slice of the embedding)."""
    unit = VOCAB_DIVISIBLE_BY * tp
    return ceil(vocab / unit) * unit


def grid_refusal(shape: ModelShape, grid: Grid, gpus_per_node: int) -> str | None:
    """Why Megatron cannot lay this model out on this grid, or None."""
    if min(grid.tp, grid.pp, grid.dp, grid.cp, grid.vp) < 1:
        return f"TP {grid.tp}, PP {grid.pp}, VP {grid.vp}, CP {grid.cp} and DP {grid.dp} must each be at least 1"
    if grid.tp > gpus_per_node:
        return f"TP {grid.tp} spans more than one node of {gpus_per_node} GPUs (its all-reduces run every block)"
    split = shape.spec.tp_refusal(shape, grid.tp)  # whole query and key/value heads a rank, as hfscale's own TP
    if split:
        return split
    if grid.pp > shape.n_layer:
        return f"PP {grid.pp} is more stages than the {shape.n_layer} layers"
    if shape.n_layer % grid.pp and not grid.uneven_stages:
        return f"PP {grid.pp} does not divide the {shape.n_layer} layers into equal stages (Megatron-LM needs it)"
    if grid.vp > 1:
        if grid.uneven_stages:
            return f"VP {grid.vp}: Megatron-DeepSpeed's pipeline engine has no interleaved schedule (Megatron-LM's has)"
        if grid.pp == 1:
            return f"VP {grid.vp} interleaves pipeline stages, and PP 1 has none"
        if shape.n_layer % (grid.pp * grid.vp):
            return (f"VP {grid.vp} does not cut each of the PP {grid.pp} stages' {shape.n_layer // grid.pp} layers "
                    "into equal model chunks")
    return None


def stage_layers(shape: ModelShape, grid: Grid) -> int:
    """Blocks on the busiest stage: L / PP, or its ceiling when the stages are cut unevenly."""
    return ceil(shape.n_layer / grid.pp)


# ---- activations (Korthikanti et al. 2022, Table 2) ------------------------------------------------------------------

GPT_LAYER_TERMS = (10.0, 24.0, 5.0)  # Korthikanti et al.'s GPT layer: 10sbh replicated over TP, 24sbh split, 5as^2b


def layer_activation_terms(shape: ModelShape, dropout: bool = True) -> tuple[float, float, float]:
    """What one transformer layer keeps for its backward, in Korthikanti et al.'s units, for this model's widths:
    (replicated, split, scores) - bytes = sbh x (replicated + split / t) + scores x as^2b / t. Counted as the paper
    counts its GPT layer (16-bit tensors, 1-byte dropout masks):
    replicated over TP (split only under sequence parallelism): the two norms' inputs 4, the QKV and MLP matmuls'
    inputs 2 + 2, and - with dropout - the attention output's and the MLP output's masks 1 + 1;
    split: Q 2, K and V 2 each at the key/value width (grouped-query attention: kv_hidden/h of it), the attention
    output (the projection's input) 2 - Q and the attention output at the query width (q_hidden/h: 1 unless the model
    sets its own head width) - and the MLP's inner tensors - GeLU's input and output 2 + 2 at the ffn width,
    SwiGLU's gate and up outputs and their product 2 + 2 + 2;
    scores: the softmax output 2, and with attention dropout its mask 1 and output 2.
    GPT (ffn 4h, dropout): (10, 24, 5), the paper's 34sbh + 5as^2b. Llama 3.1 70B (ffn 3.5h, 8 of 64 heads' keys and
    values, no dropout): (8, 25.5, 2)."""
    h = shape.hidden
    q, kv = shape.q_hidden / h, shape.kv_hidden / h
    mlp = (6 if shape.spec.gated_mlp else 4) * shape.ffn_size / h
    return 8.0 + (2.0 if dropout else 0.0), 2 * q + 4 * kv + 2 * q + mlp, 2.0 + (3.0 if dropout else 0.0)


def activation_bytes_per_layer(seq: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none", cp: int = 1,
                               flash_attention: bool = False,
                               terms: tuple[float, float, float] = GPT_LAYER_TERMS) -> float:
    """Bytes one transformer layer keeps for its backward, per micro-batch, on one TP rank, for a layer of `terms`
    (layer_activation_terms; GPT's by default):
    none: sbh(10 + 24/t + 5as/(ht)) - the LayerNorms' and dropouts' 10sbh are replicated over TP, the 24sbh of the
    matmul inputs and the 5as^2b of the attention scores, softmax and its dropout are split; with sequence
    parallelism everything is split: sbh/t (34 + 5as/h). selective: the attention's 5as^2b is recomputed, not kept.
    full: only the layer's input, 2sbh (split over TP with sequence parallelism). Under context parallelism a GPU
    keeps its s/CP tokens' share, and scores of its s/CP queries against all s keys. A fused (flash) attention
    kernel - Megatron-Core's default through Transformer Engine - keeps no scores either: the 5as^2b goes, as under
    selective recomputation (its softmax statistics, 4asb bytes, are left out as <1% of the rest)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"unknown recompute granularity {recompute!r}; choose one of: {', '.join(RECOMPUTE)}")
    s, b, h, a, t = seq / cp, micro_batch, hidden, heads, tp
    replicated, split, scores = terms
    sp = sequence_parallel and t > 1
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    attention = 0 if recompute == "selective" or flash_attention else scores * a * s * seq * b / t
    linear = (replicated + split) * s * b * h / t if sp else s * b * h * (replicated + split / t)
    return linear + attention


# ---- states -------------------------------------------------------------------------------------------------------

def stage_parameters(shape: ModelShape, grid: Grid, stage: int) -> int:
    """Parameters one GPU of pipeline stage `stage` holds: its L/P blocks' matrices and column-parallel biases split
    over TP (norms and row-parallel biases - GPT-2's and BLOOM's 6h per block, Llama's 2h - replicated); the first
    stage the word embedding (split over TP, vocabulary padded) and what else precedes the blocks (GPT-2's position
    table, BLOOM's embedding LayerNorm); the last the final norm and the LM head: an untied head's own weight (split,
    padded), or - when P > 1 - the last stage's own copy of the tied word embedding."""
    spec, t = shape.spec, grid.tp
    block = spec.block_tensors(shape)
    split = sum(prod(d) for n, d in block if spec.megatron_split(f"{spec.block_prefix}.0.{n}"))
    whole = sum(prod(d) for _, d in block) - split
    blocks = stage_layers(shape, grid) * (ceil(split / t) + whole)
    embedding = padded_vocab(shape.vocab, t) * shape.hidden // t
    tensors = parameter_tensors(shape)
    first_block = next(i for i, t in enumerate(tensors) if spec.is_block(t.name))
    first = embedding + sum(t.numel for t in tensors[:first_block] if t.name != spec.embedding)
    norm = sum(t.numel for t in tensors if t.name.startswith(spec.final_norm + "."))
    head = embedding if not shape.tied_head or grid.pp > 1 else 0
    return blocks + (first if stage == 0 else 0) + (norm + head if stage == grid.pp - 1 else 0)



def grad_bytes(precision: str) -> int:
    """Megatron keeps gradients in an fp32 buffer (main_grad) under bf16 and fp32, and in fp16 under fp16."""
    return 2 if precision == "fp16" else 4


def optimizer_shard(grid: Grid, parameters: int) -> int:
    """The parameters whose masters and Adam states one GPU keeps and steps: all it holds, or 1/(DP x CP) of them
    under ZeRO-1 (Megatron's distributed optimizer shards over the GPUs that reduce a gradient)."""
    return ceil(parameters / grid.reducers) if grid.zero1 else parameters


def stage_optimizer_bytes(grid: Grid, parameters: int, precision: str) -> int:
    """Device bytes one GPU's Adam step reads and writes (Megatron's fused Adam): its optimizer_shard at fused AdamW's
    per-element traffic (formulas/memory.OPTIMIZER_STEP_BYTES, fp32 weight and gradient), with the main_grad buffer's
    own dtype, and, under mixed precision, the 16-bit weight written back."""
    stepped = optimizer_shard(grid, parameters)
    copy = DTYPE_BYTES[storage_dtype(precision)] if storage_dtype(precision) != "fp32" else 0
    return stepped * (OPTIMIZER_STEP_BYTES["adamw"] - (4 - grad_bytes(precision)) + copy)


# ---- one GPU, all together ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GridRun:
    """What one optimizer step of a 3D layout does: the grid, the work and how it is computed."""

    shape: ModelShape
    grid: Grid
    seq: int
    micro_batch: int  # samples per micro-batch per pipeline
    micro_batches: int  # M: micro-batches per optimizer step per pipeline (the accumulation)
    precision: str = "bf16"  # fp32 | bf16 | fp16 (tf32 is fp32 here)
    recompute: str = "none"
    flash_attention: bool = False  # a fused attention kernel: no s x s scores kept (Korthikanti et al.'s runs did)
    dropout: bool = True  # hidden and attention dropout masks kept (MEGATRON_DROPOUT; Korthikanti et al.'s runs)

    @property
    def global_batch(self) -> int:
        return global_batch_size(self.micro_batch, self.micro_batches, self.grid.dp)

    @property
    def dtype(self) -> str:
        """What weights and activations are stored in (TF32 computes in fp32 tensors)."""
        return storage_dtype(self.precision)

    def in_flight(self, stage: int) -> float:
        """Micro-batches stage `stage` holds activations for, in whole passes through its layers: in 1F1B P - stage,
        at most M; interleaved, the chunk forwards of its warm-up plus the one before the first backward, 2 (P -
        stage - 1) + (V - 1) P + 1 (at most all M V), each through 1/V of the stage's layers."""
        pp, v, m = self.grid.pp, self.grid.vp, self.micro_batches
        if v == 1:
            return min(pp - stage, m)
        return min(2 * (pp - stage - 1) + (v - 1) * pp + 1, m * v) / v


def stage_memory(run: GridRun, stage: int) -> RankMemory:
    """Bytes on one GPU of pipeline stage `stage`, with Adam (Megatron's optimizer): 16-bit weights with fp32
    gradients, fp32 masters and Adam's two states (18 bytes per parameter under bf16); ZeRO-1 divides the masters and
    states over DP x CP. Activations: the stage's L/P layers (layer_activation_terms: the model's widths) for each
    micro-batch in flight (GridRun.in_flight); the first stage adds the embedding's dropout mask per micro-batch (with
    dropout), the last the final LayerNorm's and LM head's inputs
    and the fp32 logits of the vocabulary-parallel cross-entropy (4sbv/t), whose gradient is the backward's first
    peak. Under full recomputation the backward rebuilds one layer's activations at a time on top."""
    shape, grid, b, s, h = run.shape, run.grid, run.micro_batch, run.seq, run.shape.hidden
    precision = run.dtype
    n = stage_parameters(shape, grid, stage)
    mem = RankMemory()
    mem.parameters = DTYPE_BYTES[precision] * n
    mem.gradients = grad_bytes(precision) * n
    shard = optimizer_shard(grid, n)
    mem.master_weights = MASTER_BYTES * shard if precision != "fp32" else 0
    mem.optimizer_states = ADAMW_STATE_BYTES * shard
    sp = grid.sequence_parallel and grid.tp > 1
    split = grid.tp if sp else 1
    tokens = s / grid.cp  # a GPU's share of each sequence under context parallelism
    layers = stage_layers(shape, grid)
    terms = layer_activation_terms(shape, run.dropout)
    per_layer = activation_bytes_per_layer(s, b, h, shape.n_head, grid.tp, grid.sequence_parallel, run.recompute,
                                           grid.cp, run.flash_attention, terms)
    flight = run.in_flight(stage)
    kept = flight * layers * per_layer
    peak_extra = 0.0
    if stage == 0 and run.dropout:  # the embedding's dropout mask, 1 byte an element, per micro-batch in flight
        kept += min(grid.pp, run.micro_batches) * tokens * b * h / split
    if stage == grid.pp - 1:
        logits = 4 * tokens * b * padded_vocab(shape.vocab, grid.tp) / grid.tp
        kept += 4 * tokens * b * h / split + logits
        peak_extra = logits  # the logits' gradient at the start of the backward
    if run.recompute == "full":
        peak_extra = max(peak_extra, activation_bytes_per_layer(s, b, h, shape.n_head, grid.tp, grid.sequence_parallel,
                                                                cp=grid.cp, flash_attention=run.flash_attention,
                                                                terms=terms))
    mem.activations, mem.activation_peak = int(kept), int(kept + peak_extra)
    schedule = f"interleaved (VP {grid.vp})" if grid.vp > 1 else "1F1B"
    mem.activation_calibration = ("Korthikanti et al. 2022 per-layer formulas at this model's widths "
                                  f"(sbh x ({terms[0]:g} + {terms[1]:g}/t) + {terms[2]:g} as^2b/t), "
                                  f"{schedule}: {flight:g} micro-batch(es) in flight on stage {stage}")
    return mem


def busiest_stage(run: GridRun) -> tuple[int, RankMemory]:
    """(stage, its memory) of the pipeline stage that needs the most device memory: the first (most micro-batches in
    flight) or the last (the LM head's logits)."""
    stages = {0, run.grid.pp - 1}
    return max(((k, stage_memory(run, k)) for k in stages), key=lambda x: x[1].device_total)


# ---- time per step --------------------------------------------------------------------------------------------------

def hardware_flops_per_sequence(shape: ModelShape, seq: int, recompute: str) -> int:
    """FLOPs one sequence costs in a training step under Megatron's recomputation: 3 x forward, plus the blocks'
    forward again (full), or the attention's QK^T and AV again (selective)."""
    parts = forward_flops_per_sequence(shape, seq)
    forward = sum(parts.values())
    again = {"none": 0, "selective": parts["attention_scores"] + parts["attention_context"],
             "full": forward - parts["lm_head"]}[recompute]
    return 3 * forward + again


@dataclass
class GridStep:
    """Seconds of one optimizer step of a 3D layout, by where they go (total_s is their sum)."""

    compute_s: float  # M micro-batches of one stage's share of the FLOPs
    tp_comm_s: float  # TP's all-reduces (not overlapped: Megatron runs them in the compute stream)
    p2p_s: float  # activations and their gradients sent between stages
    bubble_s: float  # the P - 1 idle slots of the pipeline's fill and drain (1/V of a micro-batch's each, interleaved)
    dp_comm_s: float  # the gradient all-reduce over DP (ZeRO-1: reduce-scatter + all-gather), and the tied embedding's
    total_s: float
    comm_bytes: float = 0.0  # what one GPU sends per step over every dimension (ring volumes)
    optimizer_s: float = 0.0  # the busiest stage's Adam step, once per step (in total_s)
    cp_comm_s: float = 0.0  # context parallelism's key/value ring where the attention's compute does not hide it


def cp_exchange_s(run: GridRun, flops_per_s: float, links: Links, gpus_per_node: int) -> tuple[float, float]:
    """(exposed seconds, bytes sent) of one layer's context-parallel ring for one micro-batch on one GPU: the forward
    passes its s/CP tokens' keys and values CP - 1 times, the backward keys, values and their gradients (twice the
    bytes); each pass overlaps the attention scores and context it computes meanwhile (the backward's twice the
    forward's), and only what outlasts them is charged. Full recomputation passes the forward's again."""
    shape, grid = run.shape, run.grid
    if grid.cp == 1:
        return 0.0, 0.0
    kv = 2 * run.micro_batch * run.seq / grid.cp * shape.kv_hidden / grid.tp * DTYPE_BYTES[run.dtype]
    parts = forward_flops_per_sequence(shape, run.seq)
    attention = ((parts["attention_scores"] + parts["attention_context"]) / shape.n_layer * run.micro_batch
                 / grid.tp / grid.cp / flops_per_s)
    bw, latency = links.point_to_point(grid.tp * grid.cp > gpus_per_node)  # CP ranks lie TP apart
    forward = (grid.cp - 1) * (kv / bw + latency)
    backward = (grid.cp - 1) * (2 * kv / bw + latency)
    forwards = 2 if run.recompute == "full" else 1
    exposed = forwards * max(0.0, forward - attention) + max(0.0, backward - 2 * attention)
    return exposed, (grid.cp - 1) * kv * (forwards + 2)


def grid_step_time(run: GridRun, *, flops_per_s: float, links: Links, gpus_per_node: int,
                   memory_bw: float = 0.0) -> GridStep:
    """Time of one step at `flops_per_s` achieved per GPU on the matmuls (calibrated from a measured run):
    M micro-batch slots of [the busiest stage's compute (its ceil(L/P) of the L blocks' share of the FLOPs, over
    T x CP) + TP all-reduces + 2V point-to-point sends + CP's exposed ring], the (P - 1)/V slots of the pipeline's
    bubble, then the gradient reduction over DP x CP, exposed, and the Adam step at `memory_bw` bytes/s
    (stage_optimizer_bytes; 0: not timed apart, as in a rate calibrated without it). TP's efficiency loss is its
    all-reduces only: smaller per-GPU matmuls that run below the calibrated rate are not modelled (docs/project.md:
    the check against Megatron's published table)."""
    shape, grid, b, s = run.shape, run.grid, run.micro_batch, run.seq
    act = DTYPE_BYTES[run.dtype]
    padded = replace(shape, vocab=padded_vocab(shape.vocab, grid.tp))
    layers = stage_layers(shape, grid)  # the busiest stage sets the pace
    compute = (hardware_flops_per_sequence(padded, s, run.recompute) * b * layers / shape.n_layer / grid.tp / grid.cp
               / flops_per_s)
    message = b * s / grid.cp * shape.hidden * act  # one layer's activations (or their gradient) for one micro-batch
    tp = layers * TP_ALL_REDUCES[run.recompute] * collective_s("all_reduce", message, grid.tp, gpus_per_node, links,
                                                               across_nodes=False)
    p2p = 0.0
    if grid.pp > 1:  # V sends forward, V back per micro-batch (one per model chunk), each split over TP (Megatron's
        # scatter-gather optimisation)
        across = grid.tp * grid.cp * grid.dp >= gpus_per_node  # the next stage's ranks are T x CP x D ranks away
        bw, latency = links.point_to_point(across)
        p2p = 2 * grid.vp * (message / grid.tp / bw + latency)
    cp_layer, cp_bytes = cp_exchange_s(run, flops_per_s, links, gpus_per_node)
    cp = layers * cp_layer
    slot = compute + tp + p2p + cp
    m = run.micro_batches
    n = max(stage_parameters(shape, grid, k) for k in {0, grid.pp - 1})
    ranks = grid.tp * grid.cp * grid.dp  # a stage's GPUs; a gradient's DP x CP reducers lie T apart among them
    span = ranks > gpus_per_node
    spanned = ceil(ranks / gpus_per_node) if span else 1  # the nodes they lie on
    g = grad_bytes(run.precision) * n
    sent = m * (layers * TP_ALL_REDUCES[run.recompute] * RING["all_reduce"][0](grid.tp) * message
                + (2 * grid.vp * message / grid.tp if grid.pp > 1 else 0) + layers * cp_bytes)
    sent += (RING["reduce_scatter"][0](grid.reducers) * (g + act * n) if grid.zero1
             else RING["all_reduce"][0](grid.reducers) * g)
    if grid.zero1:
        dp = (collective_s("reduce_scatter", g, grid.reducers, gpus_per_node, links, span, spanned)
              + collective_s("all_gather", act * n, grid.reducers, gpus_per_node, links, span, spanned))
    else:
        dp = collective_s("all_reduce", g, grid.reducers, gpus_per_node, links, span, spanned)
    if grid.pp > 1:  # the first and last stages' copies of the tied embedding sum their gradients
        embedding = padded_vocab(shape.vocab, grid.tp) * shape.hidden // grid.tp
        dp += collective_s("all_reduce", grad_bytes(run.precision) * embedding, 2, gpus_per_node, links,
                           ranks * (grid.pp - 1) >= gpus_per_node)
        sent += grad_bytes(run.precision) * embedding
    bubble = (grid.pp - 1) * slot / grid.vp
    optimizer = stage_optimizer_bytes(grid, n, run.precision) / memory_bw if memory_bw else 0.0
    return GridStep(m * compute, m * tp, m * p2p, bubble, dp, m * slot + bubble + dp + optimizer, sent, optimizer,
                    m * cp)
