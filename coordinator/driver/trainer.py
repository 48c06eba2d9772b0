"""The driver's side of the warm trainer (training/warm.py): start it once, hand it each update, notice its end.

    trainer = WarmTrainer(run)
    code = trainer.update(argv, logfile)   # one node: python -m training's exit code; None: it could not start

    gen = trainer.plan(placement)          # several nodes, the master: the trainers' generation (None: fresh)
    if trainer.join(gen, new, placement):  # every node that trains: its part of that generation is up
        code = trainer.job(argv, logfile)

One trainer per run and node, as the tracked group `trainer`, kept until the run ends. A single node
launches it at the start of the run (update.prestart: its imports run beside vLLM's start-up, and on a CPU
the update-check is its first job); several nodes start theirs together at an update. An update it cannot
take (it did not start within TRAINER_START_S) runs in fresh processes, and so do the rest of the run's
updates; an update it died in fails (the served policy stays), and the next update starts a new one, as
does an update after the training code or configs changed (`code_digest`: the trainer imported them when
it started). BATON_WARM_TRAINER=0 runs every update fresh.

On several nodes every node's trainer is one torchrun node of a single process group, so they start
and end together: the master's plan of each update names the generation to train in, a new one
when its own trainer is not running or the training's nodes changed (continue mode); each node
starts its part of a new generation, and an update that failed anywhere ends every node's trainer.
"""

from __future__ import annotations

import hashlib
import json
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.driver import procs
from coordinator.driver.say import log, warn
from coordinator.driver.supervise import EXPIRED
from coordinator.driver.vllm_settings import gpu_count
from rollout_engine.defaults import TRAINER_START_S, WARM_TRAINER
from rollout_engine.exits import Exit
from rollout_engine.files import save_json
from training import sigkill
from training.warm import FRESH, JOB, READY, STARTED, Placement, done_name, job_phase

GROUP = "trainer"

#: the checkout's folders a trainer imports or reads its recipes from: a change there after the warm trainer
#: started is not in its processes
CODE_DIRS = ("training", "configs", "rollout_engine")


def code_digest(root: str | Path) -> str:
    """A hash of the training code and configs under the checkout `root` (each .py and .yaml file's path and
    bytes): what a warm trainer started with, and what the update-check's verdict depends on."""
    digest = hashlib.sha256()
    files = sorted(p for d in CODE_DIRS for p in Path(root, d).rglob("*") if p.suffix in (".py", ".yaml"))
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


#: seconds past a job's launch.timeout_s (counted from when the driver saw it start) before the driver stops a
#: trainer whose own watchdog did not end it (a stopped worker, a hung one)
GRACE_S = 30
#: MiB of tensors a worker may leave alive after a job (done.<r>.json's tensors_alive_mib) before the driver says so:
#: a training leaves none (docs/update.md), and on a CPU nothing else notices what each update adds
KEPT_TENSORS_MIB = 256


@dataclass
class Job:
    """One update handed to the trainer: done when each of its workers reported `seq`, when the trainer
    ended (FAILED), or past its deadline (EXPIRED; the caller stops the trainer)."""

    trainer: WarmTrainer
    seq: int
    deadline: float | None = None
    timeout_s: float = 0.0
    #: each worker's report of the job (its done file), once all of them reported it
    reports: list[dict] = field(default_factory=list)

    def poll(self) -> int | None:
        reports = self.trainer.reports(self.seq)
        if reports is not None:
            self.reports = reports
            codes = [int(report.get("exit", Exit.FAILED)) for report in reports]
            return codes[0] if codes[0] else max(codes)
        if self.trainer.group_code() is not None:
            return Exit.FAILED
        if self.deadline is None:
            started = WarmTrainer._read(self.trainer.dir / STARTED)
            if started is not None and int(started.get("seq", 0)) == self.seq:
                self.timeout_s = float(started.get("timeout_s", 0))
                self.deadline = time.monotonic() + self.timeout_s + GRACE_S
        elif time.monotonic() > self.deadline:
            return EXPIRED
        return None


class WarmTrainer:
    def __init__(self, run) -> None:
        self.run = run
        self.dir = run.layout.trainer_dir(run.rank)
        self.log = run.layout.trainer_log(run.rank)
        self.seq = 0
        self.nproc = 0
        self.placement: Placement | None = None
        #: several nodes: the generation this node's trainer was started for (the master's plan names it)
        self.gen = 0
        #: it failed to start once: this run's updates are fresh (several nodes: the master's plans say so)
        self.given_up = False
        #: start() waits for the workers; stop() during that wait (from a watch) interrupted it
        self.starting = self.interrupted = False
        #: code_digest of the checkout when the running trainer started
        self.code = ""
        #: where the last launch put it, and when (wait_ready counts BATON_TRAINER_START_S from then)
        self.launched: Placement | None = None
        self.began = self.launched_at = 0.0

    def group_code(self) -> int | None:
        """The trainer group's exit code once it ended (0 when none was started)."""
        group = self.run.groups.group(GROUP)
        return 0 if group is None else group.poll()

    def alive(self) -> bool:
        """Its group runs (ready or still starting)."""
        group = self.run.groups.group(GROUP)
        return group is not None and group.poll() is None

    def running(self) -> bool:
        """It runs and its workers are ready for jobs."""
        return self.alive() and self.nproc > 0

    def serves(self, placement: Placement) -> bool:
        """It runs at `placement` with the checkout's training code and configs as they are now (else the next
        update starts a new trainer: an edit since it started would not be in its processes)."""
        if not self.running() or self.placement != placement:
            return False
        if code_digest(self.run.root) != self.code:
            log("warm trainer: the training code or configs changed since it started; starting a new one")
            return False
        return True

    def launch(self, placement: Placement) -> None:
        """Start the trainer at `placement` without waiting for its workers (a single node starts it beside vLLM's
        start-up: wait_ready, or the first update, waits for them)."""
        self.stop()
        self.seq = 0
        # a new trainer starts at job 1: the last one's job and reports would read as answered or pending
        answers = [self.dir / READY, self.dir / JOB, self.dir / STARTED]
        for stale in [*answers, *self.dir.glob(done_name("*"))]:
            stale.unlink(missing_ok=True)
        cmd = [self.run.pythons.train, "-m", "training.warm", "--dir", str(self.dir), "--log", str(self.log)]
        cmd += placement.args()
        self.code = code_digest(self.run.root)
        self.launched, self.began, self.launched_at = placement, time.monotonic(), time.time()
        where = f", node {placement.node_rank} of {placement.nnodes}" if placement.nnodes > 1 else ""
        log(f"warm trainer: starting{where} (log: {self.log})")
        self.run.groups.start(GROUP, cmd, self.log, env=self.run.env())

    def launching(self, placement: Placement) -> bool:
        """It was launched at `placement` with the checkout as it is now, and still starts (its workers not ready
        yet, or not seen to be)."""
        if self.nproc or self.launched != placement or not self.alive():
            return False
        return code_digest(self.run.root) == self.code

    def wait_ready(self, fallback: str) -> bool:
        """Wait until the launched trainer's workers are up (on several nodes: every node's), at most
        BATON_TRAINER_START_S from its launch; False (stopped, and given up: `fallback` says what happens
        instead) when they are not."""
        limit = TRAINER_START_S.value()
        self.starting, self.interrupted = True, False
        while time.monotonic() - self.began < limit:
            ready = self._read(self.dir / READY)
            if ready is not None:
                self.starting = False
                self.nproc, self.placement = int(ready.get("nproc", 1)), self.launched
                log(f"warm trainer: {self.nproc} worker(s) ready in {self.ready_s():.0f}s")
                return True
            if self.group_code() is not None:
                break
            self.run.supervisor.sleep(0.2)
        self.starting = False
        if self.interrupted:  # stopped from a watch while it started (several nodes: a partner's part failed)
            return False
        why = "exited" if self.group_code() is not None else f"was not ready within {limit}s (BATON_TRAINER_START_S)"
        warn(f"the warm trainer {why}; {fallback} (its log: {self.log})")
        self.stop()
        self.given_up = True
        return False

    def ready_s(self) -> float:
        """Seconds from its launch to its workers' word (the file's time: a trainer launched beside vLLM's
        start-up is looked at only after it)."""
        try:
            return max(0.0, (self.dir / READY).stat().st_mtime - self.launched_at)
        except OSError:
            return time.monotonic() - self.began

    def start(self, placement: Placement, fallback: str) -> bool:
        """Start the trainer at `placement` and wait until its workers are up (wait_ready)."""
        self.launch(placement)
        return self.wait_ready(fallback)

    def update(self, argv: list[str], logfile: Path) -> int | None:
        """One node: run `python -m training`'s arguments `argv` in the trainer, started (again) when it is not
        running at the update's placement; its exit code, or None when there is no trainer to run it (the caller
        runs it fresh). A trainer that ended during the update: FAILED."""
        placement = placement_of(argv)
        if self.given_up:
            return None
        if not self.serves(placement):
            fallback = "this run's updates run in fresh processes"
            if not (self.wait_ready(fallback) if self.launching(placement) else self.start(placement, fallback)):
                return None
        code = self.job(argv, logfile)
        if code == FRESH:  # launch.nproc_per_node / launch.nnodes the trainer was not started with
            warn(f"the warm trainer cannot run this update's layout (its log: {logfile}); this run's updates run fresh")
            self.stop()
            self.given_up = True
            return None
        return code

    def plan(self, placement: Placement) -> tuple[int, bool] | None:
        """Several nodes, the master (at `placement`): the generation of trainers this update trains in, and
        whether it is a new one (its own trainer is not running, the training's nodes or the code changed); None: fresh
        processes (BATON_WARM_TRAINER=0, or a trainer that could not start)."""
        if not WARM_TRAINER.value() or self.given_up:
            return None
        if self.serves(placement):
            return self.gen, False
        return self.gen + 1, True

    def join(self, gen: int, new: bool, placement: Placement) -> bool:
        """Several nodes: this node's part of generation `gen` is up, started when the plan says `new`; False
        (said why) when it did not start, or when this node's trainer is not the one the others train in (it
        ended since the last update, or this node joined since): the update fails, and the next one starts a
        new generation on every node."""
        if new:
            self.gen = gen
            return self.start(placement, "this update fails; the next ones run in fresh processes")
        if gen == self.gen and self.running():
            return True
        warn(
            f"this node's warm trainer is not running (generation {gen} expected, {self.gen} here); this update "
            f"fails and the next one starts a new trainer on every node (its log: {self.log})"
        )
        return False

    def job(self, argv: list[str], logfile: Path) -> int:
        """The running trainer runs `argv` (python -m training's arguments); its exit code (FAILED when the trainer
        ended during it, which is then stopped)."""
        seq = self.submit(argv, logfile)
        began, offset = time.monotonic(), self.log.stat().st_size if self.log.exists() else 0
        phase = job_phase(argv)
        log(f"update: {'' if phase == 'all' else phase + ' '}handed to the warm trainer (log: {logfile})")
        job = Job(self, seq)
        code = self.run.supervisor.wait(job)
        if code == EXPIRED:
            warn(
                f"training exceeded {job.timeout_s:.0f} s (launch.timeout_s) and {GRACE_S} s more; stopping the warm "
                f"trainer (its log: {self.log}); this update failed, the next one starts a new trainer"
            )
            self.stop()
            return Exit.FAILED
        if self.group_code() is not None:
            warn(
                f"the warm trainer ended during the update after {time.monotonic() - began:.0f}s (its log: "
                f"{self.log}); this update failed, the next one starts a new trainer"
                + (f"; {sigkill.HINT}" if killed_by_sigkill(self.log, offset) else "")
            )
            self.stop()
        elif (kept := most_tensors_kept(job.reports)) > KEPT_TENSORS_MIB:
            warn(
                f"the warm trainer still holds {kept:.0f} MiB of tensors after this update ({self.dir}/done.<rank>.json"
                "): something the training made is still referenced (an objective that keeps its tensors?), and each "
                "update may add to it; BATON_WARM_TRAINER=0 trains every update in fresh processes (docs/update.md)"
            )
        return code

    def submit(self, argv: list[str], logfile: Path) -> int:
        """Hand the trainer `argv` (python -m training's arguments), its output to `logfile`; the job's number. A
        trainer still starting takes it once its workers are up."""
        self.seq += 1
        logfile.parent.mkdir(parents=True, exist_ok=True)
        save_json(self.dir / JOB, {"seq": self.seq, "argv": argv, "log": str(logfile)})
        return self.seq

    def reports(self, seq: int) -> list[dict] | None:
        """Each worker's report of job `seq` (its done file: the exit code and what it kept), once all of them
        reported it (None: not yet, or stopped)."""
        if self.nproc == 0:
            return None
        found = []
        for rank in range(self.nproc):
            done = self._read(self.dir / done_name(rank))
            if done is None or int(done.get("seq", 0)) != seq:
                return None
            found.append(done)
        return found

    def stop(self) -> None:
        """Stop the trainer's group; its torchrun groups (listed beside its log) follow, or get SIGKILL."""
        self.interrupted = self.starting  # not a failure to start: start() returns False without giving up
        self.run.groups.stop(GROUP, 15)
        kill_listed(self.log.with_name(self.log.name + ".pgid"))
        self.nproc, self.placement = 0, None

    @staticmethod
    def _read(path: Path) -> dict | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None


def most_tensors_kept(reports: list[dict]) -> float:
    """The most MiB of tensors any worker reported alive after a job (0 when none said)."""
    return max((float(report.get("tensors_alive_mib", 0)) for report in reports), default=0.0)


def placement_of(argv: list[str]) -> Placement:
    """Where one node's trainer runs an update of `argv`: launch.nproc_per_node workers, else one a GPU (1 on CPU)."""
    return Placement(nproc_of(argv) or gpu_count() or 1)


def nproc_of(argv: list[str]) -> int:
    """launch.nproc_per_node as the update's overrides set it (the last one wins, as in Hydra); 0 when unset."""
    values = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("launch.nproc_per_node=")]
    return int(values[-1]) if values and values[-1].isdigit() else 0


def killed_by_sigkill(log: Path, offset: int) -> bool:
    """torchrun reported a worker's SIGKILL in the trainer's log after byte `offset` (where this update began)."""
    try:
        with open(log, "rb") as text:
            text.seek(offset)
            return sigkill.reported(text.read()[-20000:].decode(errors="replace"))
    except OSError:
        return False


#: how long a SIGKILLed group may take to exit
KILLED_S = 5


def kill_listed(listing: Path) -> None:
    """SIGKILL the groups a training's `.pgid` listing names (training.launch.run_group), each only while its pid
    names the recorded leader; return once they are gone."""
    try:
        lines = listing.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            killed, deadline = int(parts[0]), time.monotonic() + KILLED_S
            if procs.signal_group(killed, parts[1], signal.SIGKILL):
                while procs.group_alive(killed) and time.monotonic() < deadline:
                    time.sleep(0.02)
