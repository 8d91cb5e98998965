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
