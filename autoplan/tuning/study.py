"""`run_tune`: an Optuna study whose trials are real probe runs.

Order of work for one worker:
1. Build the space (`candidates.build_candidates`): legal strategies the engine can run and predicted to fit;
   the others are recorded as pruned with the reason and never launched.
2. Open the study (`load_if_exists=True`, so an interrupted run resumes and several workers share one study
   through an RDB URL: sqlite here; PostgreSQL/MySQL URLs pass straight to Optuna). A new study is seeded with
   the cost model's top plans through `study.enqueue_trial`.
3. Each trial: take the enqueued plan if one waits, else the fastest untried candidate under the corrected
   model; skip (PRUNED, reason recorded) a plan another worker already tried or that the memory correction no
   longer fits; probe it; record status, reason, log and predicted vs measured as trial user attrs; tell Optuna
   the measured tokens/s/GPU (COMPLETE) or FAIL. Failures, OOMs and hangs never stop the study.
4. Refit the correction factors on every finished probe of the study and re-rank what is left.

Stopping a worker loses no finished trial: Optuna commits each trial's result as it is told. A worker that is
interrupted (SIGINT, SIGTERM) records its running trial as FAIL with the reason before it exits; one that is
killed outright (SIGKILL) leaves it RUNNING with its `worker` (host:pid) recorded, and the next worker on that
host marks it FAIL as soon as it finds that process gone (any worker does once the trial is older than a probe
can last). A storage that is not a readable database (corrupted, truncated) is bad input: one line, exit 2.

Testing hook: `AUTOPLAN_TUNE_FAULTS="1:fail,2:hang"` injects a fault into the probes of those trial numbers
(`AUTOPLAN_FAULT` for ds_train.py); it exists to test failure handling and must not be set in real use.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import optuna

from autoplan.errors import InputError, ProbeFailure
from autoplan.integrations.launchers import LauncherName
from autoplan.integrations.probe import DEFAULT_BUILD_TIMEOUT_S, ProbeResult, run_probe
from autoplan.solvers.space import Problem
from autoplan.tuning.calibration import Corrections, corrected_step_time, fit_corrections
from autoplan.tuning.candidates import Candidate, Pruned, build_candidates, capacity_gib, fit_reason, plan_of
from autoplan.tuning.report import TuneReport, build_report

PARAM = "strategy"
FAULTS_ENV = "AUTOPLAN_TUNE_FAULTS"
DEFAULT_SEEDS = 3
STALE_MARGIN_S = 120.0  # launch, log parsing and teardown on top of the probe timeout


def parse_faults(text: str) -> Dict[int, str]:
    """'1:fail,2:hang' -> {1: 'fail', 2: 'hang'}."""
    faults: Dict[int, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        number, _, kind = item.partition(":")
        if not number.strip().isdigit() or kind.strip() not in ("fail", "hang"):
            raise InputError(f"{FAULTS_ENV} item {item!r} must be N:fail or N:hang (trial number, fault)")
        faults[int(number)] = kind.strip()
    return faults


def open_study(storage: Optional[str], study_name: str, seed: int, attempts: int = 5) -> optuna.Study:
    """Create or load the study. Workers starting together may race to create the schema; retry briefly.
    The sampler is never asked for a plan (each trial's plan is enqueued); it only fills the record."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for attempt in range(attempts):
        try:
            return optuna.create_study(storage=storage, study_name=study_name, direction="maximize",
                                       load_if_exists=True, sampler=optuna.samplers.RandomSampler(seed=seed))
        except (ImportError, ValueError) as e:
            raise InputError(f"--storage {storage!r} cannot be opened ({' '.join(str(e).split())}); use a URL "
                             f"such as sqlite:///autoplan.db or postgresql://user@host/db") from None
        except Exception as e:  # sqlalchemy OperationalError/IntegrityError while another worker creates tables
            if attempt == attempts - 1 or "sqlalchemy" not in type(e).__module__:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


@contextlib.contextmanager
def storage_errors(storage: Optional[str]):
    """A storage that is not a readable database (corrupted or truncated file) is bad input, said in one line.
    Lock contention (OperationalError, a subclass) is not caught here: open_study retries it."""
    from sqlalchemy.exc import DatabaseError, OperationalError

    try:
        yield
    except DatabaseError as e:
        if isinstance(e, OperationalError):
            raise
        cause = str(getattr(e, "orig", e)).splitlines()[0]
        raise InputError(f"--storage {storage!r} is not a readable Optuna database ({cause}); move the file aside "
                         f"(or restore it from a copy) and pass it again, or pass another --storage") from None


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def tried_keys(study: optuna.Study) -> Dict[str, optuna.trial.FrozenTrial]:
    """Strategy key -> the trial that probed (or is probing) it, in any worker."""
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING)
    out: Dict[str, optuna.trial.FrozenTrial] = {}
    for t in study.get_trials(deepcopy=False, states=states):
        key = t.params.get(PARAM)
        if key is not None and (t.user_attrs.get("status") or t.state == optuna.trial.TrialState.RUNNING):
            out.setdefault(key, t)
    return out


def current_corrections(study: optuna.Study, by_key: Dict[str, Candidate]) -> Corrections:
    """Fit the correction factors on every finished probe of the study (all workers)."""
    time_points, memory_points = [], []
    for t in study.get_trials(deepcopy=False):
        cand = by_key.get(t.params.get(PARAM, ""))
        if cand is None:
            continue
        if t.user_attrs.get("status") == "ok" and t.user_attrs.get("measured_step_time_s"):
            time_points.append((cand.estimate, float(t.user_attrs["measured_step_time_s"])))
        if t.user_attrs.get("measured_peak_mem_gib"):
            memory_points.append((cand.estimate, float(t.user_attrs["measured_peak_mem_gib"])))
    return fit_corrections(time_points, memory_points)


def next_candidate(candidates: List[Candidate], tried: Dict[str, object], corr: Corrections
                   ) -> Optional[Candidate]:
    """The fastest untried candidate under the corrected model that still fits after the memory correction."""
    left = [c for c in candidates if c.key not in tried
            and fit_reason(c.estimate, capacity_gib(c.estimate), corr.memory_scale) is None]
    return min(left, key=lambda c: (corrected_step_time(c.estimate, corr), c.key)) if left else None


def memory_excluded(candidates: List[Candidate], tried: Dict[str, object], corr: Corrections) -> List[Pruned]:
    """Untried candidates that the memory correction rules out, with the reason (never launched)."""
    out = []
    for c in candidates:
        reason = None if c.key in tried else fit_reason(c.estimate, capacity_gib(c.estimate), corr.memory_scale)
        if reason:
            out.append(Pruned(label=c.strategy.label(), reason=reason))
    return out


def seed_study(study: optuna.Study, candidates: List[Candidate], seeds: int) -> None:
    """Enqueue the cost model's top plans, once per study (a resumed or shared study is not seeded again)."""
    if study.get_trials(deepcopy=False) or study.user_attrs.get("seeded"):
        return
    study.set_user_attr("seeded", True)
    for cand in candidates[:seeds]:
        study.enqueue_trial({PARAM: cand.key}, user_attrs={"source": "cost-model seed"})


def record_probe(trial: optuna.trial.Trial, cand: Candidate, corrected_s: float, res: ProbeResult) -> None:
    attrs = {"status": res.status, "reason": res.error, "log": res.log_path, "label": cand.strategy.label(),
             "predicted_step_time_s": cand.estimate.step_time_s, "corrected_step_time_s": corrected_s,
             "measured_step_time_s": res.step_time_s, "measured_tokens_per_s_per_gpu": res.tokens_per_s_per_gpu,
             "predicted_tokens_per_s_per_gpu": cand.estimate.tokens_per_s_per_gpu,
             "predicted_peak_mem_gib": cand.estimate.peak_mem_gib,
             "measured_peak_mem_gib": res.measured_peak_mem_gib, "probe_wall_s": res.wall_time_s}
    for k, v in attrs.items():
        trial.set_user_attr(k, v)


def run_tune(problem: Problem, *, trials: int, out_dir: Path, storage: Optional[str] = None,
             study_name: str = "autoplan-tune", budget_minutes: float = 60.0, iters: int = 6, warmup: int = 2,
             launcher: LauncherName = "torchrun", probe_timeout_s: float = 600.0,
             build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S, seeds: int = DEFAULT_SEEDS,
             seed: int = 0, log: Callable[[str], None] = lambda s: None,
             megatron_release: Optional[str] = None) -> TuneReport:
    """Run up to `trials` probes in this worker (or until the budget or the candidates run out); Megatron files
    (the probes' and best/'s) are written for `megatron_release` (a megatron_releases.py tag, default the newest)."""
    with storage_errors(storage):
        return _run_tune(problem, trials=trials, out_dir=out_dir, storage=storage, study_name=study_name,
                         budget_minutes=budget_minutes, iters=iters, warmup=warmup, launcher=launcher,
                         probe_timeout_s=probe_timeout_s, build_timeout_s=build_timeout_s, seeds=seeds, seed=seed,
                         log=log, megatron_release=megatron_release)


def _run_tune(problem: Problem, *, trials: int, out_dir: Path, storage: Optional[str], study_name: str,
              budget_minutes: float, iters: int, warmup: int, launcher: LauncherName, probe_timeout_s: float,
              build_timeout_s: float, seeds: int, seed: int, log: Callable[[str], None],
              megatron_release: Optional[str] = None) -> TuneReport:
    if trials <= 0:
        raise InputError(f"--trials={trials} must be > 0")
    if budget_minutes <= 0:
        raise InputError(f"--budget-minutes={budget_minutes} must be > 0")
    faults = parse_faults(os.environ.get(FAULTS_ENV, ""))
    start = time.monotonic()
    candidates, pruned = build_candidates(problem)
    if not candidates:
        raise InputError(f"no strategy of the space can be probed: all {len(pruned)} legal strategies are pruned "
                         f"(first: {pruned[0].label}: {pruned[0].reason})" if pruned else
                         "the search space holds no legal strategy; relax --fix/--exclude")
    by_key = {c.key: c for c in candidates}
    study = open_study(storage, study_name, seed)
    seed_study(study, candidates, seeds)
    skipped: List[Pruned] = []
    probes = 0
    choices = sorted(by_key)
    while probes < trials and time.monotonic() - start < budget_minutes * 60:
        fail_stale_trials(study, stale_after_s=probe_timeout_s + build_timeout_s + STALE_MARGIN_S)
        corr = current_corrections(study, by_key)
        with claim_lock(storage):  # one worker at a time takes the next plan (SQLite has no row locks)
            if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
                tried = tried_keys(study)
                cand = next_candidate(candidates, tried, corr)
                if cand is None:
                    skipped += memory_excluded(candidates, tried, corr)
                    log("no untried candidate is left that is predicted to fit")
                    break
                study.enqueue_trial({PARAM: cand.key}, user_attrs={"source": "corrected cost model"})
            trial = study.ask()
            key = trial.suggest_categorical(PARAM, choices)  # the enqueued plan
        cand = by_key[key]
        skip = ("already probed by another trial" if _already_tried(study, trial, key)
                else fit_reason(cand.estimate, capacity_gib(cand.estimate), corr.memory_scale))
        if skip:
            trial.set_user_attr("reason", skip)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            skipped.append(Pruned(label=cand.strategy.label(), reason=skip))
            continue
        corrected = corrected_step_time(cand.estimate, corr)
        log(f"trial {trial.number}: probing {cand.strategy.label()} (predicted {cand.estimate.step_time_s:.4f} s, "
            f"corrected {corrected:.4f} s)")
        trial.set_user_attr("worker", worker_id())
        try:
            res = run_probe(plan_of(problem, cand), engine=problem.engine,
                            out_dir=out_dir / "trials" / f"trial-{trial.number:03d}", iters=iters, warmup=warmup,
                            launcher=launcher, timeout_s=probe_timeout_s, fault=faults.get(trial.number),
                            build_timeout_s=build_timeout_s, log=log, megatron_release=megatron_release)
        except BaseException as e:  # interrupted, or a stale build lock: record why, then stop the worker
            reason = (str(e) if isinstance(e, ProbeFailure) else
                      f"worker interrupted ({str(e) or 'SIGINT'})" if isinstance(e, KeyboardInterrupt) else
                      f"worker stopped by {type(e).__name__}: {e}")
            trial.set_user_attr("reason", reason)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        probes += 1
        record_probe(trial, cand, corrected, res)
        log(f"trial {trial.number}: {res.status}"
            + (f", {res.tokens_per_s_per_gpu:.1f} tokens/s/GPU" if res.status == "ok" else f": {res.error}"))
        if res.status == "ok":
            study.tell(trial, res.tokens_per_s_per_gpu)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    corr = current_corrections(study, by_key)
    return build_report(problem, study, candidates, pruned + skipped, corr, out_dir, storage,
                        wall_time_s=time.monotonic() - start, space_size=len(candidates) + len(pruned),
                        megatron_release=megatron_release)


_THREAD_LOCK = threading.Lock()


@contextlib.contextmanager
def claim_lock(storage: Optional[str]):
    """Serialise taking a trial among workers of one SQLite study: an exclusive lock on a file beside the
    database (fcntl.flock; processes on one host or one shared file system) and a lock among this process's
    threads. Optuna pops a waiting trial inside a transaction, but SQLite's file-level locking lets two workers pop
    the same one; server databases lock the row and need no more."""
    if not storage or not storage.startswith("sqlite:///"):
        yield
        return
    path = Path(storage[len("sqlite:///"):]).with_suffix(".claim.lock")
    with _THREAD_LOCK, open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fail_stale_trials(study: optuna.Study, stale_after_s: float) -> None:
    """Mark FAIL the RUNNING trials whose worker died: at once when the worker ran on this host and its process is
    gone, else once the trial is older than a probe can last (a resumed study would otherwise treat those
    strategies as taken forever)."""
    now = datetime.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        gone = _worker_gone(t.user_attrs.get("worker"))
        if gone or (t.datetime_start and (now - t.datetime_start).total_seconds() > stale_after_s):
            reason = f"worker {t.user_attrs['worker']} stopped before the probe ended" if gone else \
                "worker stopped before the probe ended"
            study._storage.set_trial_user_attr(t._trial_id, "reason", reason)
            study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)


def _worker_gone(worker: Optional[str]) -> bool:
    """Whether `host:pid` names a process of this host that no longer exists."""
    host, _, pid = (worker or "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _already_tried(study: optuna.Study, trial: optuna.trial.Trial, key: str) -> bool:
    """Whether another trial (any worker) probed or is probing this strategy."""
    for t in study.get_trials(deepcopy=False):
        if t.number != trial.number and t.params.get(PARAM) == key and (
                t.user_attrs.get("status") or t.state == optuna.trial.TrialState.RUNNING):
            return True
    return False
