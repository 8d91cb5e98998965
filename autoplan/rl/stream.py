"""One parameter version of verl's fully-async trainer (verl/experimental/fully_async_policy), with the rollouter's
staleness bound and the trainer's local updates of require_batches mini-batches.

What verl's code does (recipe/fully_async_policy/fully_async_rollouter.py at b25bb7d4, the commit that published
the README's tables; the same logic in verl/experimental/fully_async_policy/fully_async_rollouter.py at b178a3cd):
- required_samples = ppo_mini_batch_size x require_batches prompts: what the trainer takes for one local update
  (each prompt carries its rollout.n responses); a parameter version is trigger_parameter_sync_step local updates
  (set_max_required_samples, lines 158-172);
- the rollouter may have started at most max_required_samples = required_samples x (staleness_threshold + 1) x
  trigger_parameter_sync_step prompts since the last version update (`_should_pause_generation`, lines 585-594:
  it pauses at staleness_samples >= max_required_samples); at each update staleness_samples is reset to the
  prompts not yet consumed by the trainer (active, queued, cancelled; update_param_version, lines 193-205), so the
  rollouter runs at most staleness_threshold x N prompts ahead of the trainer, N the version's prompts;
- at the parameter sync the rollouter pauses (`pause`, lines 596-609): with partial_rollout the running responses
  are cancelled and resumed after the sync (their tail carries over); without it the pause waits for them.

Priced as a fluid rollouter: it generates prompts at the rate of its steady state (N prompts in `throughput_s`,
rollout.RolloutTime.throughput_seconds), stops when it is staleness x N ahead of the prompts consumed at the
version's start, and is paused during the sync. With staleness 0 (verl's "stream off policy pipeline") it starts
every version from nothing and the version's last prompts end with the slowest engine's drain (`tail_s`,
rollout.RolloutTime.seconds): the last local update waits for it. The trainer's k-th local update starts when its
k x required prompts have been generated and the (k-1)-th has ended; each takes 1 / trigger of the trainer's
time. Versions are repeated from an empty queue until the version time settles (the steady state the published
per-step means describe)."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Version:
    seconds: float  # one parameter version: the trainer's local updates, its waits and the sync
    trainer_wait_s: float  # the trainer's waits for samples in the version (verl's fully-async "gen" timer)
    lead_prompts: float  # prompts generated ahead of the trainer at the version's end (steady state)


def version(prompts: int, chunks: int, staleness: float, throughput_s: float, tail_s: float, trainer_s: float,
            sync_s: float, partial_rollout: bool = True, versions: int = 64) -> Version:
    """A steady-state parameter version of `prompts` prompts in `chunks` local updates (trigger_parameter_sync_step)
    with the rollouter at most `staleness` x `prompts` ahead (see module doc). `tail_s` is the time the batch takes
    from an empty engine to its last response; it bounds the last local update when the rollouter cannot run ahead
    (staleness 0) or waits for its running responses at the sync (no partial rollout)."""
    if chunks < 1 or prompts < chunks or staleness < 0:
        raise ValueError(f"version: chunks {chunks}, prompts {prompts}, staleness {staleness}")
    if not (math.isfinite(throughput_s) and math.isfinite(trainer_s)):
        return Version(math.inf, math.inf, 0.0)
    rate = prompts / throughput_s if throughput_s > 0 else math.inf
    chunk = prompts / chunks
    per_update = trainer_s / chunks
    drain = staleness == 0 or not partial_rollout
    lead, last = 0.0, Version(0.0, 0.0, 0.0)
    for _ in range(versions):
        cap = (1.0 + staleness) * prompts - lead  # prompts it may still start this version
        t, wait = 0.0, 0.0
        for k in range(1, chunks + 1):
            need = k * chunk - lead
            ready = max(0.0, need) / rate if rate < math.inf else 0.0
            if drain and k == chunks:  # the version's last prompts end with the slowest engine's tail
                ready = max(ready, tail_s if lead <= 0 else 0.0)
            wait += max(0.0, ready - t)
            t = max(t, ready) + per_update
        made = min(rate * t if rate < math.inf else cap, cap)
        lead = max(0.0, lead + made - prompts)
        now = Version(t + sync_s, wait, lead)
        if abs(now.seconds - last.seconds) <= 1e-9 * max(now.seconds, 1.0) and abs(now.lead_prompts -
                                                                                   last.lead_prompts) <= 1e-6:
            return now
        last = now
    return last
