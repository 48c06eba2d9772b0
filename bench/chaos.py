"""Fault injection: the real loop on the default model, one fault a round, `--resume`, then the invariants.

    PYTHONPATH=. $BATON_APP_PY -m bench.chaos --data-path D --rounds 6 --seed 1 --out chaos.json
    PYTHONPATH=. $BATON_APP_PY -m bench.chaos --data-path D --short      # the fixed list CI's test runs

One log path for the whole soak (a temp directory, or `--log-path`); round r runs iteration r:
`bash scripts/run.sh --rl-phase both --max-iterations 1 [--resume]` with small settings (`SETTINGS`),
waits until the fault's phase runs (its group's record in `run/rank_0/groups.json`, or LLaMA-Factory's
`training/iter_<NNNN>/train.log.pgid`, or the warm trainer's `run/rank_0/logs/trainer.log.pgid` while it
trains), waits a seeded random moment into it, and injects the fault
(`FAULTS`). Then it restarts the way docs/cli.md tells a user to (`--resume`, nothing killed by hand)
until the iteration is done, and checks the log path (bench/chaos_checks.py): every planned episode once,
the policy chain, one record per iteration, no phase past its deadline, nothing left running. Every
signal goes to the run.sh this harness started (its Popen) or to a group the run recorded, after the
leader's start time is checked as coordinator/driver/procs.py does; nothing else is ever signalled.

Prints a line per round and a table by fault (stdout; run.sh's output goes to `<log>/chaos/`), and the
same as JSON with `--out`. docs/reliability.md has the catalogue, the deadlines and a soak's table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.chaos_checks import check_log, start_time
from bench.chaos_faults import MemoryJail, SmallDisk, available, processes_of_groups
from bench.measure import cpu_record
from coordinator import groupfile
from coordinator.runstate import load_markers
from rollout_engine.layout import Layout

REPO = Path(__file__).resolve().parents[1]

#: the deadlines the harness gives run.sh (docs/reliability.md): a training, and a rollout with no episode
#: finished (BATON_ROLLOUT_STALL_S; a start-up of the engine counts, about 10 s here)
TRAIN_DEADLINE_S = 240.0
STALL_S = 45

#: a round of about a minute and a half on 2 cores: 96 train episodes, 32 held-out ones in iteration 1, one
#: optimizer step. The update needs a success to train on, and successes cluster by task: 96 tasks once each at
#: temperature 0.5 expect about 11 and find none about 8e-6 of the time, where 24 x 4 at 1 found none about once
#: in 32 (docs/benchmarks.md 3h, bench/task_success.py)
SETTINGS = [
    "policy_config.max_new_tokens=24",
    "policy_config.temperature=0.5",
    "env_config.max_vllm_sessions=8",
    "env_config.live_view=plain",
    "env_config.train_tasks_rollout_size=96",
    "env_config.n_samples_per_task=1",
    "env_config.test_tasks_rollout_size=8",
    "algorithm.max_steps=1",
    "algorithm.learning_rate=1e-4",
    "algorithm.per_device_train_batch_size=1",
    "algorithm.gradient_accumulation_steps=1",
    "algorithm.cutoff_len=512",
    # the training's deadline (a SIGSTOPped trainer is stopped by it); a training here takes 30-60 s
    f"launch.timeout_s={TRAIN_DEADLINE_S:.0f}",
]


@dataclass(frozen=True)
class Fault:
    """One kind of fault: where it strikes (`phase`: the record file it waits for) and how."""

    kind: str
    phase: str  # train_rollout | update | training (LLaMA-Factory running)
    action: str  # kill-run-sh | term-run-sh | kill-group:<name> | kill-training | stop-group:<name> |
    #              stop-training | oom-training | fill-disk
    expect: str  # what run.sh does about it, for the table
    notice: str = ""  # a hang: what run.sh prints when its deadline catches it


FAULTS = {
    f.kind: f
    for f in [
        Fault("run.sh SIGKILL (rollout)", "train_rollout", "kill-run-sh", "dies; the next run stops what it left"),
        Fault("run.sh SIGKILL (update)", "update", "kill-run-sh", "dies; the next run stops what it left"),
        Fault("run.sh SIGTERM", "train_rollout", "term-run-sh", "stops its groups, exit 143"),
        Fault("rollout SIGKILL", "train_rollout", "kill-group:rollout-train", "the rollout fails, exit 1"),
        Fault("vLLM SIGKILL", "train_rollout", "kill-group:vllm", "restarts vLLM, resumes the rollout"),
        Fault("trainer SIGKILL", "training", "kill-training", "the update fails, the old policy stays"),
        Fault(
            "rollout SIGSTOP (hang)",
            "train_rollout",
            "stop-group:rollout-train",
            "the stall deadline stops it; the server answers: resumed",
            "rollout-train: no progress for",
        ),
        Fault(
            "vLLM SIGSTOP (hang)",
            "train_rollout",
            "stop-group:vllm",
            "the stall deadline stops the rollout; the server does not answer: vLLM restarted, rollout resumed",
            "the policy server stopped answering during the train rollout",
        ),
        Fault(
            "trainer SIGSTOP (hang)",
            "training",
            "stop-training",
            "launch.timeout_s stops the training; the update fails, the old policy stays",
            "training exceeded",
        ),
        Fault("trainer OOM-killed", "training", "oom-training", "the update fails naming the OOM killer"),
        Fault("log path full (rollout)", "train_rollout", "fill-disk", "stops with ENOSPC named; --resume"),
        Fault("log path full (update)", "update", "fill-disk", "the update fails; --resume"),
    ]
}
#: the faults that need the kernel's help (bench/chaos_faults.py: root, a memory cgroup, a tmpfs)
NEEDS = {"trainer OOM-killed": "oom", "log path full (rollout)": "disk", "log path full (update)": "disk"}
#: the fixed list of the short mode (tests/e2e/test_chaos.py runs the same with --debug-mode)
SHORT = ["run.sh SIGKILL (rollout)", "rollout SIGKILL"]
#: how far into a phase a fault may strike (seconds; a phase on 2 cores: rollout ~10 s, update ~40 s)
SPREAD_S = {"train_rollout": 6.0, "update": 20.0, "training": 8.0}


@dataclass
class Round:
    round: int
    fault: str
    delay_s: float
    injected: bool = False  # False: the phase had ended before the moment came (missed)
    first_exit: int | None = None  # run.sh's exit code after the fault
    restarts: int = 0
    recovered: bool = False  # the iteration finished after --resume
    recovery_s: float = 0.0  # from the fault to the iteration done
    noticed: bool | None = None  # a hang: run.sh stopped or warned on its own
    hangs: list[str] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0
    leftovers: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    detail: str = ""  # what the fault did (MiB filled, OOM kills)
    update: str = ""  # the iteration's update as recorded (promoted vN, skipped: ..., failed ...): a soak whose
    # updates all fail for a cause of its own (a full disk, no success) tests less than its rounds say


class Chaos:
    """One soak on one log path: run.sh invocations, faults, checks."""

    def __init__(
        self,
        data: Path,
        log: Path,
        port: int,
        extra: list[str],
        run_budget_s: float,
        hang_s: float,
        out: Path | None = None,
        env: dict[str, str] | None = None,
    ):
        self.data, self.log, self.port, self.extra = data, log, port, extra
        self.run_budget_s, self.hang_s = run_budget_s, hang_s
        self.out = out or log / "chaos"  # run.sh's output (elsewhere when the log path is the disk that fills)
        self.env = env or {}
        self.disk: SmallDisk | None = None
        self.runs = 0
        self.proc: subprocess.Popen | None = None
        self.first: tuple[int, bool] | None = None  # run.sh's end, when the fault itself waited for it
        self.struck: float | None = None  # when the fault struck (monotonic)
        self.out.mkdir(parents=True, exist_ok=True)

    # ---- run.sh -------------------------------------------------------------------------------------
    def start(self, resume: bool) -> subprocess.Popen:
        """run.sh for one iteration (its own session; output to <out>/run_<k>.log, never a pipe,
        which a group left by a SIGKILLed run.sh would hold open)."""
        self.runs += 1
        cmd = ["bash", str(REPO / "scripts/run.sh"), "--data-path", str(self.data), "--log-path", str(self.log)]
        cmd += ["--rl-phase", "both", "--eval-interval", "1000", "--max-iterations", "1"]
        cmd += (["--resume"] if resume else []) + SETTINGS + self.extra
        out = open(self.out / f"run_{self.runs:03d}.log", "w")  # noqa: SIM115 (closed in finish)
        env = {**os.environ, "BATON_VLLM_PORT": str(self.port), "BATON_PROGRESS_S": "0", **self.env}
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.proc.out = out  # type: ignore[attr-defined]
        return self.proc

    def output(self) -> str:
        return (self.out / f"run_{self.runs:03d}.log").read_text()

    def finish(self, waiting_for: str) -> tuple[int, bool]:
        """Wait for run.sh within the run budget; past it (a hang), SIGTERM it as a user would, then SIGKILL
        after 60 s. Returns (exit code, hung)."""
        proc = self.proc
        assert proc is not None
        hung = False
        try:
            proc.wait(timeout=self.run_budget_s)
        except subprocess.TimeoutExpired:
            hung = True
            log(f"  hang: run.sh ran past {self.run_budget_s:.0f} s waiting for {waiting_for}; SIGTERM")
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                log("  run.sh ignored SIGTERM for 60 s; SIGKILL")
                proc.kill()
                proc.wait()
        proc.out.close()  # type: ignore[attr-defined]
        return proc.returncode, hung

    def stop(self) -> None:
        """At the harness's exit: SIGTERM the run.sh it started, if it still runs (it stops its groups)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    # ---- the run's groups ---------------------------------------------------------------------------
    def groups(self, phase: str, iteration: int) -> list[tuple[int, str]]:
        """(pgid, leader start time) of what runs `phase` now, from the run's own records."""
        layout = Layout(self.log)
        if phase == "training":  # LLaMA-Factory's groups: a fresh training's, or the warm trainer's while it trains
            paths = [layout.training_dir(iteration) / "train.log.pgid"]
            if (layout.training_dir(iteration) / "train.log").exists():
                paths.append(layout.trainer_log(0).with_name("trainer.log.pgid"))
        else:
            names = {"train_rollout": ["rollout-train"], "update": ["update", "trainer"]}.get(phase, [phase])
            records = groupfile.read(layout.groups(0))
            return [(records[n].pgid, records[n].start or "-") for n in names if n in records]
        lines = []
        for path in paths:
            with contextlib.suppress(OSError):
                lines += path.read_text().splitlines()
        return [(int(p[0]), p[1] if len(p) > 1 else "-") for p in (ln.split() for ln in lines) if p and p[0].isdigit()]

    def signal_groups(self, phase: str, iteration: int, sig: signal.Signals) -> bool:
        """Signal the groups of `phase`, each only while its pid is still the recorded leader (or gone, its
        members left: Linux reuses no pid while its group has members). False when nothing was signalled."""
        sent = False
        for pgid, start in self.groups(phase, iteration):
            now = start_time(pgid)
            if now is not None and start not in ("-", now):
                continue  # a reused pid: not ours
            try:
                os.killpg(pgid, sig)
                sent = True
            except ProcessLookupError:
                pass
        return sent

    def wait_phase(self, phase: str, iteration: int, timeout: float) -> bool:
        """Wait until `phase` of `iteration` runs (its record exists); False when run.sh exits first or
        the phase was already done."""
        done = Layout(self.log).marker(iteration, "update" if phase == "training" else phase)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.groups(phase, iteration) and not done.exists():
                return True
            if done.exists() or self.proc is None or self.proc.poll() is not None:
                return False
            time.sleep(0.05)
        raise TimeoutError(f"waited {timeout:.0f} s for the {phase} of iteration {iteration} to start")

    # ---- one fault ------------------------------------------------------------------------------------
    def inject(self, fault: Fault, iteration: int, delay: float, row: Round) -> None:
        """Wait for the fault's phase, `delay` s more, then strike (nothing when the phase ended first)."""
        if not self.wait_phase(fault.phase, iteration, self.run_budget_s):
            return
        time.sleep(delay)
        if not self.groups(fault.phase, iteration) or self.proc.poll() is not None:
            return
        kind, _, name = fault.action.partition(":")
        self.struck = time.monotonic()  # the recovery time counts from here (a hang's hold included)
        if kind == "kill-run-sh":
            self.proc.send_signal(signal.SIGKILL)  # run.sh only: its groups run on, the next run must stop them
            row.injected = True
        elif kind == "term-run-sh":
            self.proc.send_signal(signal.SIGTERM)
            row.injected = True
        elif kind == "kill-group":
            row.injected = self.signal_groups(name, iteration, signal.SIGKILL)
        elif kind == "kill-training":
            row.injected = self.signal_groups("training", iteration, signal.SIGKILL)
        elif kind == "stop-group":
            row.injected = self.signal_groups(name, iteration, signal.SIGSTOP)
            if row.injected:
                self.hold(row, fault.notice)
        elif kind == "stop-training":
            row.injected = self.signal_groups("training", iteration, signal.SIGSTOP)
            if row.injected:
                self.hold(row, fault.notice)
        elif kind == "oom-training":
            self.oom(iteration, row)
        elif kind == "fill-disk":
            assert self.disk is not None, "a disk fault needs the log path on a SmallDisk"
            row.detail = f"filled {self.disk.fill() >> 20} MiB"
            row.injected = True

    def oom(self, iteration: int, row: Round) -> None:
        """Move the training's processes into a memory cgroup far below their needs; the kernel OOM-kills."""
        pgids = [pgid for pgid, _ in self.groups("training", iteration)]
        with MemoryJail(f"baton-chaos-{os.getpid()}-{row.round}") as jail:
            moved = jail.jail(processes_of_groups(pgids))
            kills = jail.wait_oom(timeout=60)
            row.injected = kills > 0
            row.detail = f"{moved} processes jailed at {jail.limit_bytes >> 20} MiB, {kills} OOM kill(s)"
            rc, hung = self.finish("run.sh after the OOM kill")
            self.first = (rc, hung)  # inside the jail's block: it goes once run.sh has stopped what is in it

    def hold(self, row: Round, notice: str) -> None:
        """A hang: watch run.sh for hang_s; its deadline should catch the hang and say `notice` (noticed);
        otherwise SIGTERM it as a user would (run.sh sends its groups SIGTERM and SIGCONT)."""
        deadline = time.monotonic() + self.hang_s
        while time.monotonic() < deadline and self.proc.poll() is None and notice not in self.output():
            time.sleep(0.5)
        row.noticed = notice in self.output()
        if not row.noticed and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def round(self, number: int, fault: Fault, delay: float, deadlines: dict[str, float]) -> Round:
        """Iteration `number` with `fault` struck `delay` s into its phase, resumed until done, then checked."""
        row = Round(number, fault.kind, round(delay, 2))
        self.start(resume=self.runs > 0)
        self.first = None
        self.struck = None
        self.inject(fault, number, delay, row)
        struck = self.struck or time.monotonic()
        rc, hung = self.first or self.finish(f"iteration {number} after a {fault.kind}")
        if self.disk is not None and self.disk.full():
            self.disk.free()  # the user frees space before --resume
        row.first_exit = rc
        if hung:
            row.hangs.append(f"run {self.runs}: run.sh past {self.run_budget_s:.0f} s")
        done = Layout(self.log).marker(number, "iteration")
        while not done.exists() and row.restarts < 3:
            row.restarts += 1
            self.start(resume=True)
            rc, hung = self.finish(f"--resume of iteration {number}")
            if hung:
                row.hangs.append(f"run {self.runs}: run.sh --resume past {self.run_budget_s:.0f} s")
            elif rc != 0:
                row.problems.append(f"run {self.runs}: --resume exited {rc}: {self.output()[-600:]}")
        row.recovered = done.exists()
        row.update = load_markers(self.log, number).get("update", "")
        row.recovery_s = round(time.monotonic() - struck, 1)
        report = check_log(self.log, deadlines=deadlines, needles=[f"--port {self.port}"])
        row.lost, row.duplicated, row.leftovers = report.lost, report.duplicated, report.leftovers
        row.hangs += report.late
        row.problems += report.problems()
        return row


def draw(kinds: list[str], rounds: int, rng: random.Random) -> list[str]:
    """`rounds` faults: the kinds in a seeded random order, again and again (each kind once before any twice)."""
    plan: list[str] = []
    while len(plan) < rounds:
        plan += rng.sample(kinds, len(kinds))
    return plan[:rounds]


def summarize(rows: list[Round]) -> dict[str, dict[str, int]]:
    """Faults by kind: injected, missed, recovered, lost, duplicated, hangs, leftovers, problems."""
    table: dict[str, dict[str, int]] = {}
    for row in rows:
        t = table.setdefault(
            row.fault,
            dict.fromkeys(
                ["injected", "missed", "recovered", "lost", "duplicated", "hangs", "leftovers", "problems"], 0
            ),
        )
        t["injected" if row.injected else "missed"] += 1
        t["recovered"] += row.recovered
        t["lost"] += row.lost
        t["duplicated"] += row.duplicated
        t["hangs"] += len(row.hangs)
        t["leftovers"] += len(row.leftovers)
        t["problems"] += len(row.problems)
    return table


def print_table(table: dict[str, dict[str, int]]) -> None:
    cols = ["injected", "missed", "recovered", "lost", "duplicated", "hangs", "leftovers", "problems"]
    print(f"| fault | {' | '.join(cols)} |")
    print(f"|---|{'---|' * len(cols)}")
    for kind, t in table.items():
        print(f"| {kind} | {' | '.join(str(t[c]) for c in cols)} |")


def report(rows: list, module: str, argv: list[str] | None, log_path: Path, started: float, out: Path | None) -> None:
    """Print the soak's table; with `out`, write the rounds, the table, the command and the machine as JSON."""
    table = summarize(rows)
    print_table(table)
    result = {
        "command": " ".join([Path(sys.executable).name, "-m", module, *(argv or sys.argv[1:])]),
        "log_path": str(log_path),
        "cpu": cpu_record(),
        "wall_s": round(time.monotonic() - started, 1),
        "rounds": [asdict(r) for r in rows],
        "table": table,
    }
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n")


def log(message: str) -> None:
    print(message, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--data-path", type=Path, required=True)
    parser.add_argument("--log-path", type=Path, help="default: a new temp directory (kept)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--short", action="store_true", help=f"the fixed list {SHORT}, not random faults")
    parser.add_argument("--faults", default="", help="comma-separated kinds to draw from (default: all)")
    parser.add_argument("--run-budget", type=float, default=900.0, help="seconds one run.sh may take (a hang past it)")
    parser.add_argument(
        "--hang", type=float, default=TRAIN_DEADLINE_S + 60, help="seconds a hang may last before the harness SIGTERMs"
    )
    parser.add_argument("--stall", type=int, default=STALL_S, help="BATON_ROLLOUT_STALL_S for the runs")
    # promotion.keep_last (3) policies of the default model, 1.7 GB each (its fp32 weights, the tied head's copy, the
    # optimizer's moments), and the next update's 2.3 GB: at 6 GiB every update from the fourth promotion on was
    # refused for space, whatever the round's fault
    parser.add_argument("--disk-mb", type=int, default=8192, help="the log path's tmpfs size, with a disk fault")
    parser.add_argument("--out", type=Path, help="write the rounds and the table as JSON")
    parser.add_argument("overrides", nargs="*", help="more run.sh overrides (key=value)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    kinds = [k for k in args.faults.split(",") if k] or list(FAULTS)
    for kind in kinds:
        why = available(NEEDS[kind]) if kind in NEEDS else None
        if kind not in FAULTS or why:
            parser.error(f"fault {kind!r}: {why or 'unknown'} (the kinds: {', '.join(FAULTS)})")
    plan = SHORT if args.short else draw(kinds, args.rounds, rng)
    log_path = (args.log_path or Path(tempfile.mkdtemp(prefix="baton-chaos-"))).resolve()
    disk = SmallDisk(log_path, args.disk_mb) if any(NEEDS.get(k) == "disk" for k in plan) else None
    out = log_path.with_name(log_path.name + "-chaos") if disk else None  # run.sh's output off the full disk
    env = {"BATON_ROLLOUT_STALL_S": str(args.stall)}
    chaos = Chaos(args.data_path.resolve(), log_path, free_port(), args.overrides, args.run_budget, args.hang, out, env)
    # the training's deadline (launch.timeout_s + grace_s) plus its preparation and promotion; the stall
    # deadline catches a rollout (the run budget bounds the rest)
    deadlines = {
        "update": TRAIN_DEADLINE_S + 10.0 + 120.0,
        "train_rollout": args.run_budget,
        "test_rollout": args.run_budget,
    }
    log(f"chaos: {len(plan)} rounds on {log_path} (seed {args.seed}, port {chaos.port}); run.sh output: {chaos.out}/")
    rows = []
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the run.sh it started
    with contextlib.ExitStack() as stack:
        if disk:
            chaos.disk = stack.enter_context(disk)
            log(f"chaos: the log path is a {args.disk_mb} MiB tmpfs (unmounted at the end)")
        stack.callback(chaos.stop)
        for number, kind in enumerate(plan, start=1):
            fault = FAULTS[kind]
            row = chaos.round(number, fault, rng.uniform(0.0, SPREAD_S[fault.phase]), deadlines)
            rows.append(row)
            state = "injected" if row.injected else "missed (the phase ended first)"
            log(
                f"round {number}: {kind} at +{row.delay_s}s: {state}, exit {row.first_exit}, {row.restarts} resume(s), "
                f"{'recovered' if row.recovered else 'NOT recovered'} in {row.recovery_s}s; lost {row.lost}, "
                f"duplicated {row.duplicated}, hangs {len(row.hangs)}, left {len(row.leftovers)}"
                + (f", noticed by run.sh: {row.noticed}" if row.noticed is not None else "")
                + (f" ({row.detail})" if row.detail else "")
                + f"; update: {row.update or '-'}"
            )
            for problem in row.problems:
                log(f"  problem: {problem}")
    report(rows, "bench.chaos", argv, log_path, started, args.out)
    return 0 if all(r.recovered and not r.problems for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
