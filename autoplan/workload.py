"""`Workload`: what one optimizer step trains on."""
from pydantic import BaseModel, ConfigDict, Field


class Workload(BaseModel):
    """Sequence length and global batch of one training step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq_len: int = Field(gt=0, description="Tokens per sequence.")
    global_batch_size: int = Field(gt=0, description="Sequences per optimizer step (all data-parallel ranks).")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch_size


# Tokens per step (gbs x seq) at most 2^53: the cost model counts tokens, FLOPs and micro batches in float64 and
# numpy int64, and IEEE 754 doubles hold every integer up to 2^53 exactly (past 2^63 numpy cannot hold the batch
# at all). A larger step is refused, not priced wrong.
MAX_TOKENS_PER_STEP = 2**53

# Past 2^30 (about 1.07e9) tokens per step a batch is legal but absurd, and is priced with a warning: it is over 10x
# the compute-optimal batch of a 1e26-FLOP run by DeepSeek LLM's scaling law, B_opt = 0.292 * C^0.3271 tokens
# (arXiv:2401.02954 sec. 3.1, eq. 1: 9.3e7 tokens at C = 1e26), and 17x the largest published pre-training batch
# (DeepSeek-V3: 15,360 sequences of 4,096 tokens = 62,914,560, arXiv:2412.19437 sec. 4.2).
LARGE_TOKENS_PER_STEP = 2**30


def make_workload(seq_len: int, global_batch_size: int, where: str = "") -> Workload:
    """A Workload, or one-line InputError naming the rule (`where` prefixes the message, e.g. the imported file)."""
    from autoplan.errors import InputError

    prefix = f"{where}: " if where else ""
    if seq_len is None or seq_len <= 0:
        raise InputError(f"{prefix}--seq={seq_len} must be a positive number of tokens (e.g. --seq 4096)")
    if global_batch_size is None or global_batch_size <= 0:
        raise InputError(f"{prefix}--gbs={global_batch_size} must be a positive number of sequences "
                         f"(e.g. --gbs 1024)")
    tokens = seq_len * global_batch_size
    if tokens > MAX_TOKENS_PER_STEP:
        raise InputError(f"{prefix}--gbs={global_batch_size} x --seq={seq_len} = {tokens:.3g} tokens per step is more "
                         f"than 2^53 ({MAX_TOKENS_PER_STEP:.3g}), the most the cost model counts exactly; pass the "
                         f"real batch (e.g. --gbs 1024)")
    return Workload(seq_len=seq_len, global_batch_size=global_batch_size)


def workload_warning(wl: Workload) -> str:
    """A one-line warning for a legal but absurd batch (see LARGE_TOKENS_PER_STEP), or ''."""
    if wl.tokens_per_step <= LARGE_TOKENS_PER_STEP:
        return ""
    return (f"warning: --gbs={wl.global_batch_size} x --seq={wl.seq_len} = {wl.tokens_per_step:,} tokens per step, "
            f"over {LARGE_TOKENS_PER_STEP:,} (2^30, 17x the largest published pre-training batch); priced as "
            f"written, check --gbs")
