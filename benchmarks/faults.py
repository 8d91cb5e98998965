"""Fault injection: interrupt, kill, starve and corrupt autoplan as a user's machine would, and check that nothing
is lost and every exit is clean.

Each scenario runs the real `autoplan` command in a subprocess (the console script of this environment) and then
checks, from outside:
- the exit status is the one the contract gives for that fault (0 ok, 1 infeasible, 2 bad input, 3 probe
  failure, 130 interrupted; -9 for a SIGKILL, which no program can answer);
- no traceback on stdout or stderr, and a failing exit says why in one line;
- no process outlives the command: every process started under the scenario carries a marker in its environment
  (`AUTOPLAN_FAULT_RUN`), and /proc is searched for it once the command has ended;
- nothing is half-written: every file under the output folder that carries its final name parses (JSON) or is
  whole (the emitted set is all there or none of it is); temporary files left by a SIGKILL are counted apart;
- tune: every trial that had finished before the fault is still in the study after a resume.

    python -m benchmarks.faults              # every scenario (the probe and tune ones launch DeepSpeed: minutes)
    python -m benchmarks.faults --quick      # the CLI ones only (plan, emit, estimate, files): about a minute
    python -m benchmarks.faults --list

Signals are sent at a point derived from a measured run of the same command on this machine (a fraction of its
duration, or when its output shows the stage to hit), never at a fixed time. Exits 1 if any scenario fails.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

MARKER = "AUTOPLAN_FAULT_RUN"
INTERRUPTED = 130
# A SIGINT ends a command with 130 (it unwinds and says so in one line), or 0 when it came after the work was done;
# -2 (ended by the signal itself) only while the interpreter shuts down after the work, when Python has put the
# default handler back (Py_Finalize restores SIG_DFL): the output checks below hold in every case.
SIGINT_EXITS = (INTERRUPTED, 0, -2)
# The search problem the plan scenarios interrupt: large enough to run for a few seconds on a 2-core machine.
PLAN_ARGS = ["plan", "--model", "deepseek-v3", "--cluster", "h100", "--gpus", "4096", "--seq", "4096", "--gbs",
             "4096", "--precision", "any"]
# A Llama-shaped model small enough for DeepSpeed probes on 2 CPU ranks (HF config.json fields).
TINY_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128,
               "intermediate_size": 352, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
               "vocab_size": 1024, "max_position_embeddings": 512, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
               "hidden_act": "silu", "tie_word_embeddings": False}


def autoplan_cmd() -> List[str]:
    """The autoplan console script of this interpreter's environment (falls back to the module)."""
    script = Path(sys.executable).with_name("autoplan")
    return [str(script)] if script.exists() else [sys.executable, "-m", "autoplan.cli.main"]


@dataclass
class Outcome:
    """What one scenario observed."""

    name: str
    fault: str
    exit_code: Optional[int]
    expected: Tuple[int, ...]
    tracebacks: int = 0
    leftover_processes: int = 0
    half_written: List[str] = field(default_factory=list)
    stray_temp_files: int = 0
    lost_trials: int = 0
    message: str = ""
    skipped: str = ""

    @property
    def ok(self) -> bool:
        if self.skipped:
            return True
        return (self.exit_code in self.expected and not self.tracebacks and not self.leftover_processes
                and not self.half_written and not self.lost_trials)


@dataclass
class Run:
    code: Optional[int]
    out: str
    err: str
    seconds: float


def start(args: Sequence[str], run_id: str, cwd: Path, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    full_env = dict(os.environ, **(env or {}), **{MARKER: run_id, "PYTHONUNBUFFERED": "1"})
    return subprocess.Popen(list(args), cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def finish(proc: subprocess.Popen, t0: float, limit_s: float) -> Run:
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n[faults] killed after {limit_s:.0f} s: the command did not end"
    return Run(proc.returncode, out, err, time.monotonic() - t0)


def run(args: Sequence[str], run_id: str, cwd: Path, limit_s: float, env: Optional[Dict[str, str]] = None) -> Run:
    t0 = time.monotonic()
    return finish(start(args, run_id, cwd, env), t0, limit_s)


def run_and_signal(args: Sequence[str], run_id: str, cwd: Path, sig: int, after_s: float, limit_s: float,
                   env: Optional[Dict[str, str]] = None, when: Optional[Callable[[], bool]] = None) -> Run:
    """Start, wait `after_s` (or until `when()` holds, checked every 50 ms, at most `limit_s`), send `sig` to the
    command's process (not its group: a user's Ctrl-C reaches the foreground group, a kill reaches one pid)."""
    t0 = time.monotonic()
    proc = start(args, run_id, cwd, env)
    deadline = t0 + (limit_s if when else after_s)
    while time.monotonic() < deadline and proc.poll() is None:
        if when and when():
            break
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(sig)
    return finish(proc, t0, limit_s)


def processes_with(run_id: str) -> List[int]:
    """Live processes whose environment carries the scenario's marker."""
    needle = f"{MARKER}={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split(") ", 1)[1][:1]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def leftovers(run_id: str, grace_s: float) -> int:
    """Processes of the scenario still alive `grace_s` after the command ended (a killed group takes a moment)."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = processes_with(run_id)
        if not alive or time.monotonic() > deadline:
            for pid in alive:  # never leave them to the next scenario
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            return len(alive)
        time.sleep(0.1)


def tracebacks(r: Run) -> int:
    return (r.out + r.err).count("Traceback (most recent call last)")


def last_line(r: Run) -> str:
    lines = [ln for ln in r.err.strip().splitlines() if ln.strip()]
    return lines[-1][:110] if lines else ""


def check_folder(folder: Path, complete_set: Iterable[str] = ()) -> Tuple[List[str], int]:
    """(half-written files, stray temporary files) under `folder`: a final-named JSON that does not parse, or a
    partial emitted set (some of `complete_set` there, some not)."""
    if not folder.exists():
        return [], 0
    half, temps = [], 0
    for path in folder.rglob("*"):
        if not path.is_file():
            continue
        if path.name.startswith(".") and path.name.endswith((".tmp", ".old")):
            temps += 1
            continue
        if path.suffix == ".json":
            try:
                json.loads(path.read_text())
            except (ValueError, UnicodeDecodeError):
                half.append(str(path.relative_to(folder)))
    expected = list(complete_set)
    present = [name for name in expected if (folder / name).exists()]
    if present and len(present) != len(expected):
        half.append(f"partial set: {sorted(set(expected) - set(present))} missing")
    return half, temps


class Bench:
    """Scenario context: a scratch folder, the measured durations the signal times derive from."""

    def __init__(self, work: Path, seed: int):
        self.work = work
        self.rng = random.Random(seed)
        self.cmd = autoplan_cmd()
        self.baseline: Dict[str, float] = {}
        self.files: Dict[str, Path] = {}
        self.outcomes: List[Outcome] = []

    def fresh(self, name: str) -> Tuple[str, Path]:
        folder = self.work / name
        folder.mkdir(parents=True, exist_ok=True)
        return uuid.uuid4().hex, folder

    def measure(self, key: str, args: Sequence[str], cwd: Path) -> float:
        """Seconds one undisturbed run of `args` takes here (the signal points are fractions of it)."""
        if key not in self.baseline:
            r = run(self.cmd + list(args), uuid.uuid4().hex, cwd, limit_s=900)
            if r.code not in (0, 1):
                raise SystemExit(f"faults: baseline {key} failed (exit {r.code}): {last_line(r)}")
            self.baseline[key] = r.seconds
        return self.baseline[key]

    def record(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        mark = "ok " if outcome.ok else "FAIL"
        print(f"  [{mark}] {outcome.name}: exit {outcome.exit_code} {outcome.message or outcome.skipped}",
              flush=True)


# ---- scenarios: CLI -------------------------------------------------------------------------------------------

def plan_signals(b: Bench) -> None:
    """SIGINT and SIGKILL during `plan --emit megatron --out D`, at 3 points each of a measured run."""
    _, base_dir = b.fresh("plan-baseline")
    base = b.measure("plan", PLAN_ARGS + ["--emit", "megatron", "--out", str(base_dir / "out")], base_dir)
    emitted = sorted(p.name for p in (base_dir / "out").iterdir())
    for sig, expected in ((signal.SIGINT, SIGINT_EXITS), (signal.SIGKILL, (-9, 0))):
        for frac in (0.2, 0.5, 0.8):
            run_id, folder = b.fresh(f"plan-{sig.name}-{frac}")
            out = folder / "out"
            r = run_and_signal(b.cmd + PLAN_ARGS + ["--emit", "megatron", "--out", str(out)], run_id, folder, sig,
                               after_s=frac * base, limit_s=max(60.0, 20 * base))
            half, temps = check_folder(out, emitted)
            b.record(Outcome(f"plan {sig.name} at {frac:.0%}", sig.name, r.code, expected, tracebacks(r),
                             leftovers(run_id, 5.0), half, temps, message=last_line(r)))


def emit_signals(b: Bench) -> None:
    """SIGINT and SIGKILL during `emit PLAN --format F --out D`, for each engine's format."""
    for fmt in ("megatron", "deepspeed"):
        _, base_dir = b.fresh(f"emit-plan-{fmt}")
        plan_json = _small_plan(b, base_dir, fmt)
        args = ["emit", str(plan_json), "--format", fmt]
        _, mdir = b.fresh(f"emit-measure-{fmt}")
        base = b.measure(f"emit-{fmt}", args + ["--out", str(mdir / "out")], mdir)
        emitted = sorted(p.name for p in (mdir / "out").iterdir())
        for sig, expected in ((signal.SIGINT, SIGINT_EXITS), (signal.SIGKILL, (-9, 0))):
            for frac in (0.3, b.rng.uniform(0.5, 0.95)):
                run_id, folder = b.fresh(f"emit-{fmt}-{sig.name}-{frac:.2f}")
                out = folder / "out"
                r = run_and_signal(b.cmd + args + ["--out", str(out)], run_id, folder, sig, after_s=frac * base,
                                   limit_s=max(60.0, 20 * base))
                half, temps = check_folder(out, emitted)
                b.record(Outcome(f"emit {fmt} {sig.name} at {frac:.0%}", sig.name, r.code, expected, tracebacks(r),
                                 leftovers(run_id, 5.0), half, temps, message=last_line(r)))


def _small_plan(b: Bench, folder: Path, engine: str) -> Path:
    """plan.json of Llama-3-8B on 16 GPUs for `engine`, made once (its run is the measured baseline)."""
    key = f"plan-small-{engine}"
    if key not in b.files:
        out = folder / "plan"
        b.measure(key, ["plan", "--model", "llama3-8b", "--gpus", "16", "--engine", engine, "--out", str(out),
                        "--emit", engine], folder)
        b.files[key] = out / "plan.json"
    return b.files[key]


def _mount_tmpfs(target: Path, options: str) -> Optional[str]:
    """Mount a tmpfs; None on success, else why not (no privilege, no mount command)."""
    target.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return "no mount command"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["mount refused"])[-1]


def _umount(target: Path) -> None:
    subprocess.run(["umount", str(target)], capture_output=True)


def disk_faults(b: Bench) -> None:
    """`plan --emit megatron,deepspeed --out D` on a 64 KiB disk and on a read-only one."""
    for name, options in (("disk full (64 KiB tmpfs)", "size=64k"), ("read-only --out", "ro,size=1m")):
        run_id, folder = b.fresh("disk-" + options.replace(",", "-").replace("=", ""))
        mount = folder / "mnt"
        why = _mount_tmpfs(mount, options)
        if why:
            b.record(Outcome(name, "disk", None, (2,), skipped=f"skipped: cannot mount a tmpfs here ({why})"))
            continue
        try:
            out = mount / "out"
            r = run(b.cmd + ["plan", "--model", "llama3-8b", "--gpus", "16", "--emit", "megatron,deepspeed",
                             "--out", str(out)], run_id, folder, limit_s=300)
            half, temps = check_folder(mount)
            left = [str(p.relative_to(mount)) for p in mount.rglob("*") if p.is_file()]
            if left:
                half = half + [f"written despite the error: {left}"]
            b.record(Outcome(name, "disk", r.code, (2,), tracebacks(r), leftovers(run_id, 5.0), half, temps,
                             message=last_line(r)))
        finally:
            _umount(mount)


def corrupt_files(b: Bench) -> None:
    """Truncated and corrupted plan.json and profile JSON handed to `emit` and `estimate --profile`."""
    _, base_dir = b.fresh("corrupt-src")
    plan_text = _small_plan(b, base_dir, "megatron").read_text()
    profile = Path(__file__).resolve().parents[1] / "profiles" / "measured" / "cpu-tiny-llama.json"
    profile_text = profile.read_text()
    cases = [
        ("plan.json truncated", "plan.json", plan_text[: len(plan_text) // 2],
         lambda p, out: ["emit", str(p), "--format", "megatron", "--out", str(out)]),
        ("plan.json bytes flipped", "plan.json", _flip(plan_text, b.rng),
         lambda p, out: ["emit", str(p), "--format", "megatron", "--out", str(out)]),
        ("profile JSON truncated", "profile.json", profile_text[: len(profile_text) // 3],
         lambda p, out: ["estimate", "--model", "llama3-8b", "--gpus", "8", "--profile", str(p)]),
        ("profile JSON bytes flipped", "profile.json", _flip(profile_text, b.rng),
         lambda p, out: ["estimate", "--model", "llama3-8b", "--gpus", "8", "--profile", str(p)]),
    ]
    for name, filename, text, args in cases:
        run_id, folder = b.fresh("corrupt-" + name.replace(" ", "-").replace(".", ""))
        bad = folder / filename
        bad.write_text(text)
        out = folder / "out"
        r = run(b.cmd + args(bad, out), run_id, folder, limit_s=300)
        half, temps = check_folder(out)
        if out.exists() and any(out.iterdir()):
            half.append("output written from a corrupted input")
        one_line = r.code == 2 and len([ln for ln in r.err.splitlines() if ln.strip()]) == 1
        b.record(Outcome(name, "corrupt", r.code if one_line or r.code != 2 else -2, (2,), tracebacks(r),
                         leftovers(run_id, 5.0), half, temps,
                         message=last_line(r) if one_line else f"not one line: {r.err.strip()[:100]!r}"))


def _flip(text: str, rng: random.Random) -> str:
    """Overwrite 8 bytes in the middle third with random printable junk (a torn write)."""
    i = rng.randrange(len(text) // 3, 2 * len(text) // 3)
    junk = "".join(rng.choice("{}[]:,\"x\\0") for _ in range(8))
    return text[:i] + junk + text[i + 8:]


def fuzz_inputs(b: Bench, count: int = 60) -> None:
    """Fuzzed HF configs and --strategy strings through the CLI in one process each batch: no traceback, no hang."""
    import hypothesis.strategies as st
    from hypothesis import HealthCheck, given, settings

    run_id, folder = b.fresh("fuzz")
    base = b.measure("estimate-small", ["estimate", "--model", "llama3-8b", "--gpus", "8", "--strategy", "tp=2"],
                     folder)
    bound = 20 * base
    results: List[Tuple[str, Run]] = []
    keys = ["tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "sp", "zero", "recompute", "fp8", "fp8_recipe", "dp",
            "pipeline_layout", "bogus"]
    values = st.one_of(st.integers(-3, 10 ** 12).map(str), st.sampled_from(["true", "none", "full", "hybrid", "",
                                                                            "nan", "1e99", "E|t*3|L"]),
                       st.text(max_size=6))
    strategy_strings = st.lists(st.tuples(st.sampled_from(keys), values), max_size=5).map(
        lambda kv: ",".join(f"{k}={v}" for k, v in kv))
    config = st.fixed_dictionaries({
        "model_type": st.sampled_from(["llama", "mistral", "qwen2", "mixtral", "gpt2", "unknown_x"]),
        "hidden_size": st.one_of(st.integers(-8, 1 << 40), st.just("4096"), st.none()),
        "num_hidden_layers": st.one_of(st.integers(-2, 1 << 20), st.floats(allow_nan=True)),
        "num_attention_heads": st.one_of(st.integers(0, 256), st.lists(st.integers(1, 8), max_size=2)),
        "intermediate_size": st.integers(-1, 1 << 33),
        "vocab_size": st.one_of(st.integers(-1, 1 << 31), st.text(max_size=4)),
    })
    per_kind = count // 2

    @settings(max_examples=per_kind, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy_strings)
    def fuzz_strategy(text):
        results.append((f"--strategy {text!r}", run(b.cmd + ["estimate", "--model", "llama3-8b", "--gpus", "8",
                                                             "--strategy", text], run_id, folder, limit_s=bound)))

    @settings(max_examples=per_kind, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(config)
    def fuzz_config(cfg):
        path = folder / "config.json"
        path.write_text(json.dumps(cfg, allow_nan=True))
        results.append((f"config {cfg}", run(b.cmd + ["estimate", "--model", str(path), "--gpus", "8"], run_id,
                                             folder, limit_s=bound)))

    fuzz_strategy()
    fuzz_config()
    bad = [(what, r) for what, r in results if r.code not in (0, 1, 2) or tracebacks(r)]
    slow = [what for what, r in results if r.seconds >= bound]
    worst = max(r.seconds for _, r in results)
    message = (f"{len(results)} inputs, slowest {worst:.1f} s (bound {bound:.0f} s = 20x a measured estimate)"
               + (f"; first bad: {bad[0][0][:60]} -> exit {bad[0][1].code}" if bad else ""))
    b.record(Outcome(f"fuzz {len(results)} configs/strategies", "fuzz", 0 if not bad and not slow else 1, (0,),
                     sum(tracebacks(r) for _, r in results), leftovers(run_id, 5.0), message=message))


# ---- scenarios: probes and tune (DeepSpeed on CPU ranks) -----------------------------------------------------

def tiny_model(b: Bench) -> str:
    path = b.work / "tiny-llama.json"
    if not path.exists():
        path.write_text(json.dumps(TINY_CONFIG))
    return str(path)


def _probe_plan(b: Bench) -> Path:
    _, folder = b.fresh("probe-plan")
    out = folder / "plan"
    if not (out / "plan.json").exists():
        r = run(b.cmd + ["plan", "--model", tiny_model(b), "--cluster", "cpu", "--gpus", "2", "--seq", "128",
                         "--gbs", "8", "--engine", "deepspeed", "--fix", "tp=1", "--fix", "pp=1", "--out", str(out),
                         "--emit", "deepspeed"], uuid.uuid4().hex, folder, limit_s=300)
        if r.code != 0:
            raise SystemExit(f"faults: cannot make the probe plan (exit {r.code}): {last_line(r)}")
    return out / "plan.json"


def probe_faults(b: Bench) -> None:
    """A DeepSpeed probe on 2 CPU ranks that crashes, hangs, runs out of memory, is interrupted and is killed."""
    plan = _probe_plan(b)
    probe = ["probe", str(plan), "--engine", "deepspeed", "--launcher", "torchrun", "--iters", "4", "--warmup", "1"]
    _, mdir = b.fresh("probe-baseline")
    base = b.measure("probe", probe + ["--out", str(mdir / "out")], mdir)
    cases = [
        ("probe crashes (rank raises)", {"AUTOPLAN_FAULT": "fail"}, None, (3,), "failed"),
        ("probe runs out of memory", {"AUTOPLAN_FAULT": "oom"}, None, (3,), "oom"),
        ("probe hangs past --timeout", {"AUTOPLAN_FAULT": "hang"}, None, (3,), "hung"),
        ("probe SIGINT mid-run", {}, signal.SIGINT, SIGINT_EXITS + (3,), None),
        ("probe SIGKILL mid-run", {}, signal.SIGKILL, (-9, 0), None),
    ]
    for name, env, sig, expected, status in cases:
        run_id, folder = b.fresh("probe-" + name.split()[1] + "-" + (sig.name if sig else env.get("AUTOPLAN_FAULT")))
        out = folder / "out"
        args = b.cmd + probe + ["--out", str(out), "--timeout", f"{max(30.0, 3 * base):.0f}", "--json"]
        if sig:
            r = run_and_signal(args, run_id, folder, sig, after_s=0.6 * base, limit_s=max(120.0, 10 * base), env=env)
        else:
            r = run(args, run_id, folder, limit_s=max(120.0, 10 * base), env=env)
        half, temps = check_folder(out)
        message = last_line(r)
        if status:
            got = _probe_status(out)
            message = f"status {got}; {message}"
            if got != status:
                half.append(f"status {got!r}, expected {status!r}")
        b.record(Outcome(name, name, r.code, expected, tracebacks(r), leftovers(run_id, 10.0), half, temps,
                         message=message))


def _probe_status(out: Path) -> Optional[str]:
    for path in out.rglob("probe_result.json"):
        try:
            return json.loads(path.read_text()).get("status")
        except ValueError:
            return "unreadable"
    return None


def op_build_kill(b: Bench) -> None:
    """SIGKILL while the probe builds its DeepSpeed op in an empty extension folder; then a clean rerun."""
    plan = _probe_plan(b)
    run_id, folder = b.fresh("probe-opbuild")
    ext = folder / "torch_extensions"
    env = {"TORCH_EXTENSIONS_DIR": str(ext)}
    out = folder / "out"
    args = b.cmd + ["probe", str(plan), "--engine", "deepspeed", "--launcher", "torchrun", "--iters", "3",
                    "--warmup", "1", "--out", str(out)]
    building = lambda: any(ext.rglob("*.o")) or any(ext.rglob("lock"))  # noqa: E731
    r = run_and_signal(args, run_id, folder, signal.SIGKILL, after_s=0, limit_s=1800, env=env, when=building)
    # The launch's reaper ends the build (SIGTERM, a grace period, SIGKILL) and then clears its lock: give it that
    # long before anything counts as left over, then look for the lock.
    left = leftovers(run_id, 30.0)
    locks = [str(p.relative_to(folder)) for p in ext.rglob("lock")]
    rerun_id = uuid.uuid4().hex
    again = run(args, rerun_id, folder, limit_s=3600, env=env)
    half, temps = check_folder(out)
    if locks:
        half.append(f"build lock left: {locks}")
    b.record(Outcome("probe SIGKILL during op build, then rerun", "SIGKILL", again.code, (0,),
                     tracebacks(r) + tracebacks(again), left + leftovers(rerun_id, 10.0), half, temps,
                     message=f"killed with exit {r.code}; rerun: {last_line(again) or 'ok'}"))


def tune_faults(b: Bench) -> None:
    """tune interrupted (SIGINT) and killed (SIGKILL) after its first finished trial, then resumed; a corrupted and
    a truncated Optuna storage."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        run_id, folder = b.fresh(f"tune-{sig.name}")
        db = folder / "study.db"
        args = b.cmd + ["tune", "--model", tiny_model(b), "--cluster", "cpu", "--gpus", "2", "--seq", "128", "--gbs",
                        "8", "--engine", "deepspeed", "--launcher", "torchrun", "--trials", "3", "--iters", "3",
                        "--warmup", "1", "--storage", f"sqlite:///{db}", "--out", str(folder / "out")]
        r = run_and_signal(args, run_id, folder, sig, after_s=0, limit_s=3600,
                           when=lambda: _finished_trials(db) >= 1)
        before = _finished_trials(db)
        left = leftovers(run_id, 10.0)
        resume_id = uuid.uuid4().hex
        again = run(args, resume_id, folder, limit_s=3600)
        after_ids = _finished_trial_ids(db)
        lost = len(set(range(before)) - set(after_ids)) if before else 0
        half, temps = check_folder(folder / "out")
        b.record(Outcome(f"tune {sig.name} after a finished trial, resume", sig.name, again.code, (0,),
                         tracebacks(r) + tracebacks(again), left + leftovers(resume_id, 10.0), half, temps, lost,
                         message=f"{before} finished before the fault, {len(after_ids)} after resume; "
                                 f"first exit {r.code}"))
    for name, damage in (("Optuna storage corrupted", lambda p: p.write_bytes(b"SQLite format 3\0" + os.urandom(600))),
                         ("Optuna storage truncated", lambda p: p.write_bytes(p.read_bytes()[:1500]))):
        run_id, folder = b.fresh("tune-" + name.split()[-1])
        db = folder / "study.db"
        _make_study(db)
        damage(db)
        r = run(b.cmd + ["tune", "--model", tiny_model(b), "--cluster", "cpu", "--gpus", "2", "--seq", "128", "--gbs",
                         "8", "--engine", "deepspeed", "--trials", "1", "--storage", f"sqlite:///{db}", "--out",
                         str(folder / "out")], run_id, folder, limit_s=600)
        half, temps = check_folder(folder / "out")
        b.record(Outcome(name, "corrupt", r.code, (2,), tracebacks(r), leftovers(run_id, 5.0), half, temps,
                         message=last_line(r)))


def _make_study(db: Path) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{db}", study_name="autoplan-tune")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)


def _finished_trial_ids(db: Path) -> List[int]:
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            rows = con.execute("SELECT number FROM trials WHERE state IN ('COMPLETE', 'FAIL', 'PRUNED')").fetchall()
        return [int(n) for (n,) in rows]
    except sqlite3.Error:
        return []


def _finished_trials(db: Path) -> int:
    return len(_finished_trial_ids(db))


QUICK = (plan_signals, emit_signals, disk_faults, corrupt_files, fuzz_inputs)
FULL = QUICK + (probe_faults, op_build_kill, tune_faults)


def table(outcomes: Sequence[Outcome]) -> str:
    head = f"{'scenario':<46} {'exit':>5} {'want':>9} {'tb':>3} {'procs':>5} {'half':>4} {'tmp':>3} {'lost':>4}  result"
    lines = [head, "-" * len(head)]
    for o in outcomes:
        want = "|".join(str(c) for c in o.expected)
        result = o.skipped or ("ok" if o.ok else "FAIL")
        lines.append(f"{o.name:<46} {str(o.exit_code):>5} {want:>9} {o.tracebacks:>3} {o.leftover_processes:>5} "
                     f"{len(o.half_written):>4} {o.stray_temp_files:>3} {o.lost_trials:>4}  {result}")
    done = [o for o in outcomes if not o.skipped]
    lines.append("-" * len(head))
    lines.append(f"{len(done)} run, {sum(not o.ok for o in done)} failed, {len(outcomes) - len(done)} skipped; "
                 f"lost trials {sum(o.lost_trials for o in done)}, leftover processes "
                 f"{sum(o.leftover_processes for o in done)}, tracebacks {sum(o.tracebacks for o in done)}, "
                 f"half-written files {sum(len(o.half_written) for o in done)}")
    for o in done:
        if not o.ok:
            lines.append(f"  {o.name}: {o.half_written or ''} {o.message}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CLI scenarios only (no DeepSpeed launches)")
    ap.add_argument("--only", action="append", default=[], help="run the scenario groups named (see --list)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args(argv)
    groups = QUICK if args.quick else FULL
    if args.list:
        for g in FULL:
            print(f"{g.__name__:<16} {g.__doc__.splitlines()[0]}")
        return 0
    if args.only:
        names = {g.__name__: g for g in FULL}
        unknown = [n for n in args.only if n not in names]
        if unknown:
            print(f"faults: unknown scenario group {unknown[0]!r}; see --list", file=sys.stderr)
            return 2
        groups = tuple(names[n] for n in args.only)
    work = Path(tempfile.mkdtemp(prefix="autoplan-faults-"))
    bench = Bench(work, args.seed)
    try:
        for group in groups:
            print(f"{group.__name__}: {group.__doc__.splitlines()[0]}", flush=True)
            group(bench)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(bench.outcomes))
    return 0 if all(o.ok for o in bench.outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
