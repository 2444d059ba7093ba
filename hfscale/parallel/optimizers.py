"""The optimizer axis (`--optim`): one registry entry per optimizer, with everything hfscale knows about it.

An entry says which optimizer the Trainer builds for it on each engine and route, how many state elements it keeps
per parameter element (what the start-up proof checks is sharded), whether its curve can match AdamW's across shard
layouts (parity), and which memory rule counts its states (hfscale.formulas.memory.optimizer_state_bytes). Which
strategy x optimizer pairs are refused is the strategy table's business (strategies.INCOMPATIBLE).
"""

from dataclasses import dataclass, field

from ..errors import one_of


@dataclass(frozen=True)
class Optimizer:
    name: str  # hfscale's name (--optim)
    summary: str
    hf_name_gpu: str  # the Trainer's `optim` on the GPU route
    hf_name_cpu: str  # on the CPU route
    hf_name_by_engine: dict = field(default_factory=dict)  # engine -> the Trainer's `optim` there, on both routes
    memory_rule: str = "adamw"  # formulas.memory.optimizer_state_bytes' rule for its states
    memory_rule_by_engine: dict = field(default_factory=dict)  # engine -> rule, where another library steps it
    state_elements_per_param: int | None = None  # elements of state per parameter element, when proportional
    eight_bit: bool = False  # uint8 states (the start-up proof looks for them)
    factored: bool = False  # factored second moments (rows + columns, not a full copy)
    lossy: str | None = None  # why its curve differs between shard layouts; None: exact up to summation order
    lossy_by_engine: dict = field(default_factory=dict)  # engine -> why, where only that engine makes it differ

    def hf_name(self, on_gpu: bool, engine: str | None = None) -> str:
        """The Trainer's `optim` for this optimizer on this route and engine."""
        if engine in self.hf_name_by_engine:
            return self.hf_name_by_engine[engine]
        return self.hf_name_gpu if on_gpu else self.hf_name_cpu

    def memory_rule_for(self, engine: str) -> str:
        return self.memory_rule_by_engine.get(engine, self.memory_rule)

    def lossy_for(self, engine: str) -> str | None:
        """Why this optimizer's curve differs from the same optimizer under ddp on this engine; None: it does not."""
        return self.lossy_by_engine.get(engine, self.lossy)


OPTIMIZERS: dict[str, Optimizer] = {
    # Fused AdamW needs its parameters on an accelerator; on CPU the foreach implementation is the fast one.
    "adamw": Optimizer("adamw", "torch AdamW (fused kernel on GPU); 8 bytes of state per parameter",
                       "adamw_torch_fused", "adamw_torch", memory_rule="adamw", state_elements_per_param=2),
    # transformers' Adafactor; the Trainer passes no beta1, so there is no first moment.
    "adafactor": Optimizer("adafactor", "Adafactor (transformers); factored second moment, ~4 bytes/row+col",
                           "adafactor", "adafactor", memory_rule="adafactor", factored=True,
                           lossy_by_engine={"deepspeed": "DeepSpeed steps flat 1-D partitions, so Adafactor neither "
                                            "factors its second moment nor clips its update by each tensor's RMS "
                                            "there: another update than ddp's, by design"}),
    # bitsandbytes' AdamW8bit; under FSDP2 torchao's AdamW8bit, whose 8-bit states are DTensors of its own subclass
    # (bitsandbytes' kernels have no DTensor rule).
    "adamw_8bit": Optimizer("adamw_8bit", "8-bit AdamW: bitsandbytes, or torchao's AdamW8bit under fsdp* (DTensor "
                            "states); ~2 bytes of state per parameter",
                            "adamw_bnb_8bit", "adamw_bnb_8bit", hf_name_by_engine={"fsdp": "adamw_torch_8bit"},
                            memory_rule="bnb_8bit", memory_rule_by_engine={"fsdp": "torchao_8bit"},
                            state_elements_per_param=2, eight_bit=True,
                            lossy="8-bit Adam quantizes its states blockwise; block boundaries follow each strategy's "
                                  "shards"),
}


def get_optimizer(name: str) -> Optimizer:
    if name not in OPTIMIZERS:
        raise one_of("optimizer", name, OPTIMIZERS)
    return OPTIMIZERS[name]
