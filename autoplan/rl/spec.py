"""The inputs of an RL post-training plan: the job (`RLJob`), where rollout and training run (`Placement`) and the
rollout engines' layout (`RolloutLayout`), with the parsers of their command-line text.

Vocabulary (verl, slime): a step generates `samples` responses for each of `prompts` prompts (rollout), scores them
(reward), computes log-probabilities under the reference and the current actor (ref, old_log_prob), moves the new
weights from the training layout to the rollout layout (refit) and trains (train)."""
from __future__ import annotations

from typing import Dict, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoplan.errors import InputError

Algo = Literal["grpo", "ppo"]
Mode = Literal["on-policy", "one-step-off", "async"]
Engine = Literal["vllm", "sglang"]
Offload = Literal["none", "swap", "optimizer", "all"]

ALGOS = ("grpo", "ppo")
MODES = ("on-policy", "one-step-off", "async")
ENGINES = ("vllm", "sglang")
# Training-state offload: none (all resident); swap (verl param_offload + grad_offload + optimizer_offload: the states
# go to the host while a colocated engine generates and come back to train, Adam on the GPU); optimizer (CPU Adam,
# Megatron --optimizer-cpu-offload: optimizer states live on the host, the update runs there); all (CPU Adam and the
# weights and gradients swapped as in `swap`, verl's DeepSeek-V3 recipe).
OFFLOADS = ("none", "swap", "optimizer", "all")

# Host RAM per node, GiB, of nodes whose datasheet states it: NVIDIA DGX H100 and DGX H200 have "2TB System Memory"
# (NVIDIA DGX H100/H200 datasheets: 8x H100 80GB / 8x H200 141GB, 2x Intel Xeon 8480C, 2TB system memory). Other
# nodes are built with anything from 0.5 to 4 TB, so there the user states it (--host-mem-gib).
HOST_MEM_GIB = {"h100": 2048.0, "h200": 2048.0}


class RLJob(BaseModel):
    """What one RL step does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    algo: Algo = Field(description="grpo (no critic) or ppo (a critic trained beside the actor).")
    prompts: int = Field(gt=0, description="Prompts per step (verl data.train_batch_size, slime --rollout-batch-size).")
    samples: int = Field(gt=0, description="Responses per prompt (verl rollout.n, slime --n-samples-per-prompt).")
    prompt_len: int = Field(gt=0, description="Prompt length, tokens (mean).")
    response_len: int = Field(gt=0, description="Mean response length, tokens.")
    max_response_len: int = Field(gt=0, description="Longest response, tokens (verl data.max_response_length); "
                                                    "equal to response_len: every response has the mean length.")
    mode: Mode = Field("on-policy", description="on-policy, one-step-off (rollout of step n+1 overlaps training of "
                                                "step n) or async (streamed rollout with partial rollouts).")
    use_ref: bool = Field(True, description="A reference model's log-probabilities are computed (KL loss/penalty).")
    mini_batches: int = Field(1, gt=0, description="Optimizer steps per RL step (prompts / ppo_mini_batch_size).")
    micro_batch_tokens: Optional[int] = Field(None, gt=0, description=(
        "Sequences are packed into micro-batches by length, at most this many tokens per GPU (verl "
        "use_dynamic_bsz with actor.ppo_max_token_len_per_gpu; slime --use-dynamic-batch-size with "
        "--max-tokens-per-gpu); None: one sequence per micro-batch."))
    host_mem_gib: float = Field(gt=0, description="Host RAM per node, GiB.")
    staleness: Optional[float] = Field(None, ge=0, description=(
        "async only: how far the rollouter may run ahead of the trainer, in parameter versions (verl fully-async "
        "async_training.staleness_threshold; 0: each version's rollout starts after its sync); None: unbounded, "
        "the rollout and the trainer overlap fully (autoplan/rl/stream.py)."))
    require_batches: Optional[int] = Field(None, gt=0, description=(
        "async only: mini-batches per local update of the trainer (verl fully-async async_training.require_batches;"
        " a parameter version is mini_batches / require_batches local updates); None: one update per version."))

    @model_validator(mode="after")
    def _streaming(self) -> "RLJob":
        if (self.staleness is not None or self.require_batches is not None) and self.mode != "async":
            raise ValueError(f"staleness / require_batches apply to mode async only, not {self.mode}")
        if self.require_batches is not None and self.mini_batches % self.require_batches:
            raise ValueError(f"require_batches {self.require_batches} must divide mini_batches {self.mini_batches} "
                             f"(a parameter version is a whole number of local updates)")
        return self

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    @property
    def mean_seq_len(self) -> int:
        return self.prompt_len + self.response_len


RADIX_CACHE_IS_SGLANGS = "radix_cache=false is SGLang's --disable-radix-cache; vLLM (verl) has no such setting"


class RolloutLayout(BaseModel):
    """The rollout engines: `engines` copies of one engine of tp x dp GPUs; attention is split tp ways in each of
    dp attention groups (SGLang --enable-dp-attention, vLLM data_parallel_size), the experts ep ways."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: Engine = "vllm"
    tp: int = Field(1, gt=0)
    dp: int = Field(1, gt=0)
    ep: int = Field(1, gt=0)
    engines: int = Field(1, gt=0)
    gpu_memory_utilization: float = Field(0.85, gt=0, le=0.99)
    cuda_graphs: bool = Field(True, description="Decode replays CUDA graphs (vLLM enforce_eager=False).")
    radix_cache: bool = Field(True, description=(
        "SGLang's radix (prefix) cache, on by default (false: --disable-radix-cache). On a hybrid it holds 5 state "
        "slots per running request, off 1 (autoplan/rl/rollout.py SglangHybridPools); vLLM has no such setting."))

    @model_validator(mode="after")
    def _radix_cache_is_sglangs(self) -> "RolloutLayout":
        if not self.radix_cache and self.engine != "sglang":
            raise ValueError(RADIX_CACHE_IS_SGLANGS)
        return self

    @property
    def gpus_per_engine(self) -> int:
        return self.tp * self.dp

    @property
    def gpus(self) -> int:
        return self.gpus_per_engine * self.engines

    def to_dict(self) -> Dict[str, object]:
        return {"engine": self.engine, "tp": self.tp, "dp": self.dp, "ep": self.ep, "engines": self.engines,
                "gpu_memory_utilization": self.gpu_memory_utilization, "cuda_graphs": self.cuda_graphs,
                **({"radix_cache": self.radix_cache} if self.engine == "sglang" else {})}


class Placement(BaseModel):
    """Colocated: training and rollout take turns on every GPU. Split: `train_gpus` train, the rest generate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["colocated", "split"]
    gpus: int = Field(gt=0)
    train_gpus: int = Field(gt=0)

    @property
    def rollout_gpus(self) -> int:
        return self.gpus if self.kind == "colocated" else self.gpus - self.train_gpus

    def to_dict(self) -> Dict[str, object]:
        return {"kind": self.kind, "train_gpus": self.train_gpus, "rollout_gpus": self.rollout_gpus}


def parse_placement(text: str, gpus: int) -> Placement:
    """--placement colocated | split:TRAIN_GPUS."""
    t = text.strip().lower()
    if t == "colocated":
        return Placement(kind="colocated", gpus=gpus, train_gpus=gpus)
    if t.startswith("split:"):
        raw = t[len("split:"):]
        if not raw.isdigit() or not 0 < int(raw) < gpus:
            raise InputError(f"--placement {text!r}: TRAIN_GPUS must be a whole number between 1 and {gpus - 1} "
                             f"(--gpus {gpus}); e.g. --placement split:{max(1, gpus // 2)}")
        return Placement(kind="split", gpus=gpus, train_gpus=int(raw))
    raise InputError(f"--placement {text!r} is not 'colocated' or 'split:TRAIN_GPUS'; e.g. --placement split:"
                     f"{max(1, gpus // 2)}")


_ROLLOUT_INT_KEYS = ("tp", "dp", "ep", "engines")


def parse_rollout(text: str) -> Dict[str, object]:
    """--rollout 'tp=..,dp=..,ep=..,engines=..,gpu_memory_utilization=..' (every key optional)."""
    out: Dict[str, object] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep:
            raise InputError(f"--rollout item {item!r} is not key=value; e.g. --rollout tp=4,engines=8")
        if key in _ROLLOUT_INT_KEYS:
            if not value.strip().isdigit() or int(value) < 1:
                raise InputError(f"--rollout {key}={value!r} must be a positive whole number; e.g. {key}=2")
            out[key] = int(value)
        elif key == "gpu_memory_utilization":
            try:
                frac = float(value)
            except ValueError:
                frac = -1.0
            if not 0.0 < frac <= 0.99:
                raise InputError(f"--rollout gpu_memory_utilization={value!r} must be a fraction in (0, 0.99]; "
                                 f"e.g. gpu_memory_utilization=0.6")
            out[key] = frac
        elif key in ("cuda_graphs", "radix_cache"):
            if value.strip().lower() not in ("true", "false"):
                raise InputError(f"--rollout {key}={value!r} must be true or false")
            out[key] = value.strip().lower() == "true"
        else:
            raise InputError(f"--rollout key {key!r} is unknown; valid: tp, dp, ep, engines, gpu_memory_utilization, "
                             f"cuda_graphs, radix_cache")
    return out


def micro_batch_tokens_default(prompt_len: int, longest_response: int, given: Optional[int], cp: int = 1) -> int:
    """Tokens per GPU per packed micro-batch: the user's, else one prompt + the longest response, the smallest cap
    that admits every sequence without context parallelism (what the emitters write: verl
    actor.ppo_max_token_len_per_gpu, slime --max-tokens-per-gpu). Both frameworks refuse a sequence longer than
    the cap x the context-parallel size (verl seqlen_balancing.rearrange_micro_batches' assert; slime
    backends/megatron_utils/data.py), so a smaller cap is one line of error."""
    longest = prompt_len + longest_response
    if given is None:
        return longest
    if given < 1 or given * cp < longest:
        raise InputError(f"--micro-batch-tokens={given} x context parallel {cp} is below one prompt + the longest "
                         f"response ({longest} tokens), which verl and slime refuse; pass --micro-batch-tokens "
                         f"{-(-longest // cp)} or more")
    return int(given)


def host_mem_default(gpu_id: str, given: Optional[float]) -> float:
    """Host RAM per node, GiB: the user's, else the node datasheet's (HOST_MEM_GIB), else a one-line error."""
    if given is not None:
        if given <= 0:
            raise InputError(f"--host-mem-gib={given} must be positive (host RAM per node, GiB; e.g. 2048)")
        return float(given)
    if gpu_id in HOST_MEM_GIB:
        return HOST_MEM_GIB[gpu_id]
    raise InputError(f"host RAM per node of {gpu_id} nodes is not known; pass --host-mem-gib (e.g. --host-mem-gib "
                     f"2048 for 2 TB nodes)")
