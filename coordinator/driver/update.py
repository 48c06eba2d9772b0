"""The update: its command, the check before the first rollout, one node's and several nodes' update,
and stopping a running one so that its training groups end too."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from coordinator.driver import procs
from coordinator.driver.context import Run
from coordinator.driver.nodes import Synced
from coordinator.driver.phase import mark, run_group, tail, timed, watch_start, watch_stop
from coordinator.driver.ports import free_port
from coordinator.driver.say import Die, log, warn
from coordinator.driver.supervise import EXPIRED
from coordinator.driver.trainer import Job, WarmTrainer, code_digest, kill_listed, placement_of
from coordinator.driver.vllm_settings import device
from coordinator.serving import served_dtype
from rollout_engine.defaults import CHECK_TIMEOUT_S, WARM_TRAINER
from rollout_engine.exits import Exit
from rollout_engine.metrics_log import load_metrics
from training.warm import Placement


def update_cmd(run: Run, iteration: int, phase: str, *extra: str) -> list[str]:
    """`python -m training` for `phase`. A single node takes a free torchrun port; on several, every node
    uses the master's address and the port it chose at the start of the run. An override of
    launch.master_port, which comes later, still wins. The update is told the dtype this node's vLLM computes
    in, which promotion keeps when it is wider than the model's."""
    launch = [
        f"launch.nnodes={run.train_nodes or run.args.num_nodes}",
        f"launch.node_rank={run.rank if run.train_rank is None else run.train_rank}",
    ]
    if run.node.multi:
        launch += [f"launch.master_addr={run.node.master_addr}", f"launch.master_port={run.node.torchrun_port}"]
        if run.args.node_addr:
            launch.append(f"launch.node_addr={run.args.node_addr}")
    else:
        launch.append(f"launch.master_port={free_port()}")
    cmd = [run.pythons.train, "-m", "training", "--config-name", "update", f"log_path={run.log}"]
    cmd += [f"iteration={iteration}", f"model_path={run.policy_path()}", f"phase={phase}"]
    # promotion keeps what the trainer learned at the precision vLLM computes in (training.precision)
    served = f"promotion.served_dtype={served_dtype(device(), os.environ.get('BATON_VLLM_DTYPE', ''))}"
    return cmd + launch + [served] + list(extra) + run.composed.update


# The check ------------------------------------------------------------------------------------------


@dataclass
class Check:
    """The update-check started beside vLLM's start-up (None when not run): in its own process (group
    update-check), or as job `seq` of the warm trainer started beside it."""

    logfile: Path
    key: str
    started: float
    cmd: list[str]
    seq: int = 0


def check_key(run: Run, cmd: list[str]) -> str:
    """A hash of what decides the check's verdict: its command (not the iteration, whose output the check
    never writes, nor its free torchrun port), the device, and the training code and configs."""
    digest = hashlib.sha256()
    for part in cmd:
        if not re.match(r"^(launch\.master_port|iteration)=", part):
            digest.update(part.encode() + b"\n")
    digest.update(device().encode() + b"\n")
    digest.update(run.model_record.get("identity", "").encode() + b"\n")  # the model's files, not just its path
    digest.update(code_digest(run.root).encode())
    return digest.hexdigest()


def check_start(run: Run, next_iteration: int) -> Check | None:
    """A run that trains: start `python -m training phase=check` beside vLLM's start-up; on several nodes the
    master checks. A single node starts its warm trainer now too (prestart); on a CPU the check is that trainer's
    first job, so the training stack is imported once for the check and every update. A check that passed with
    the same key is not run again."""
    if run.args.phase == "rollout" or not run.node.is_master:
        return None
    trainer = prestart(run)
    cmd = update_cmd(run, next_iteration, "check")
    check = Check(run.run_dir / "logs" / "update-check.log", check_key(run, cmd), time.monotonic(), cmd)
    ok = run.run_dir / "update-check.ok"
    if ok.is_file() and ok.read_text().strip() == check.key:
        log("update-check: passed before with this command, environment and code; not run again")
        return None
    check.logfile.parent.mkdir(parents=True, exist_ok=True)
    check.logfile.write_text("")
    # on a GPU the check keeps a process of its own with the GPUs hidden (training.launch.hidden_gpus): in the
    # trainer it would initialise CUDA there while vLLM measures the memory it may take
    if trainer is not None and device() == "cpu":
        check.seq = trainer.submit(cmd[cmd.index("update") + 1 :], check.logfile)
        log(f"update-check: handed to the warm trainer (log: {check.logfile})")
        return check
    start_check(run, check)
    return check


def prestart(run: Run) -> WarmTrainer | None:
    """A single node that trains launches its warm trainer at the start of the run, so that its imports run
    beside vLLM's start-up and the first rollout instead of before the first update. Several nodes' trainers
    start together at an update (the master's plan names their generation)."""
    if run.node.multi or not WARM_TRAINER.value():
        return None
    if run.trainer is None:
        run.trainer = WarmTrainer(run)
    run.trainer.launch(placement_of(run.composed.update))
    return run.trainer


def start_check(run: Run, check: Check) -> None:
    log(f"update-check: started (log: {check.logfile})")
    run.groups.start("update-check", check.cmd, check.logfile, env=run.env())


def check_wait(run: Run, check: Check | None) -> None:
    """Wait for the check; a rejection ends the run with exit 2 and its message, a failure with 1. A check the
    warm trainer could not run (it did not start, or ended during the check) runs in a process of its own."""
    if check is None:
        return
    limit = CHECK_TIMEOUT_S.value()
    code = check_in_trainer(run, check, limit) if check.seq else None
    if code is None:
        if check.seq:
            start_check(run, check)
        group = run.groups.group("update-check")
        if group is None:
            return
        left = max(1.0, limit - (time.monotonic() - check.started))  # counted from its start beside vLLM's
        code = run.supervisor.wait(group, total_s=left)
        if code == EXPIRED:
            run.groups.stop("update-check", 10)
        run.groups.forget("update-check")
    if code == EXPIRED:
        raise Die(
            1,
            f"the check of the update configuration did not finish within {limit}s (BATON_CHECK_TIMEOUT_S); "
            f"stopped it. Its log: {check.logfile}",
        )
    if chosen := check_verdict(code, check.logfile):
        log(chosen)
    ok = run.run_dir / "update-check.ok"
    ok.with_suffix(".ok.tmp").write_text(check.key + "\n")
    ok.with_suffix(".ok.tmp").replace(ok)
    log(f"update-check: the update configuration is accepted ({int(time.monotonic() - check.started)}s)")


def check_in_trainer(run: Run, check: Check, limit: float) -> int | None:
    """The check's exit code as job `check.seq` of the warm trainer (EXPIRED past `limit` seconds from its start:
    the trainer is stopped); None when the trainer did not start or ended during the check."""
    trainer = run.trainer
    if trainer is None or not trainer.wait_ready("the update-check and this run's updates run in fresh processes"):
        return None
    left = max(1.0, limit - (time.monotonic() - check.started))
    code = run.supervisor.wait(Job(trainer, check.seq), total_s=left)
    if code == EXPIRED:
        trainer.stop()
        return EXPIRED
    if trainer.reports(check.seq) is None:
        warn(f"the warm trainer ended during the update-check (its log: {trainer.log}); checking in a process instead")
        trainer.stop()
        check.logfile.write_text("")
        return None
    return code


def check_verdict(code: int, logfile: Path) -> str:
    """The check's exit `code` (its output in `logfile`): a rejection (2) ends the run with exit 2 and its report,
    another failure with 1 and its log's last lines; 0 passes and returns the training template it found. The
    run and --dry-run say the same."""
    if code == Exit.BAD_INPUT:
        raise Die(
            2,
            "the update would reject this configuration (checked in the train environment before any rollout; "
            f"log: {logfile}):\n{check_problems(logfile)}",
        )
    if code != 0:
        print(tail(logfile), file=sys.stderr, flush=True)
        raise Die(1, f"the check of the update configuration failed (exit {code}; last lines of {logfile} above)")
    return check_choice(logfile)


def log_lines(logfile: Path) -> list[str]:
    return logfile.read_text(errors="replace").splitlines() if logfile.is_file() else []


def check_choice(logfile: Path) -> str:
    """The check's word on the training template it found from the model ("" when it gave none)."""
    found = [line[line.index("chat template: ") :] for line in log_lines(logfile) if "chat template: " in line]
    return found[-1] if found else ""


def logged_after(lines: list[str], *headers: str) -> list[str] | None:
    """The lines after the last of `headers` that python -m training logs before its report (None: no such
    header). A fresh process logs the bare header, the warm trainer its logger's prefix before it."""
    starts = [i for i, line in enumerate(lines) if line.split("] ")[-1] in headers]
    return lines[starts[-1] + 1 :] if starts else None


def check_problems(logfile: Path) -> str:
    """The check's report: its log after "bad config:" / "bad input:", else its last 15 lines."""
    lines = log_lines(logfile)
    report = logged_after(lines, "bad config:", "bad input:")
    return "\n".join(lines[-15:] if report is None else report)


def nothing_to_train(logfile: Path) -> str:
    """Why an update exited 3, in the training's words (its one line after "nothing to train on:"), or ""."""
    reason = [line for line in logged_after(log_lines(logfile), "nothing to train on:") or [] if line.strip()]
    return reason[0].strip() if reason else ""


# One update -----------------------------------------------------------------------------------------


def update_phase(run: Run, iteration: int, resume: bool) -> str:
    """ "all", or "promote" when --resume finds a finished training of `iteration` not yet promoted."""
    trained = (run.layout.training_dir(iteration) / "output" / "config.json").is_file()
    if not (resume and trained):
        return "all"
    rows = load_metrics(Path(run.log))
    return "promote" if any(r.get("kind") == "training" and r.get("iteration") == iteration for r in rows) else "all"


def update(run: Run, iteration: int, resume: bool) -> None:
    """Train on the new trajectories and promote; a failure keeps the old policy (and ends the run after
    --max-update-failures in a row; a rejected input ends it at once, exit 2)."""
    from coordinator import runstate

    if runstate.is_done(run.log, iteration, "update"):
        return
    logfile = run.layout.phase_log(run.rank, iteration, "update")
    serving = run.args.phase == "both" and not run.args.debug and run.server is not None
    # Only a run that serves may put its own vLLM to sleep; an update-only run leaves servers alone.
    if serving and not run.server.sleep():
        warn("could not put vLLM to sleep; training beside it")
    run.update_running = iteration
    with timed(run, iteration, "update"):
        if run.node.multi:
            code = update_nodes(run, iteration, logfile, resume)
        else:
            code = update_node(run, update_cmd(run, iteration, update_phase(run, iteration, resume)), logfile)
    run.update_running = 0
    if serving and not run.server.wake():
        warn("could not wake vLLM up")
    if not run.node.is_master:
        return
    run.failed_iteration = 0
    if code == 0:
        run.failures = 0
        outcome = f"promoted v{run.policy_version()}"
    elif code == Exit.BAD_INPUT:  # python -m training: bad input (a config only the train environment checks)
        mark(run, iteration, "update", "failed (exit 2: bad input)")
        raise Die(
            2,
            f"iteration {iteration}: the update rejected its input (see {logfile}); fix the configuration, then "
            "rerun with --resume (the rollouts are kept; every further update would fail the same way):\n"
            + check_problems(logfile),
        )
    elif code == Exit.NOTHING_TO_TRAIN:
        outcome = "skipped: too little to train on"
        reason = nothing_to_train(logfile) or "too few usable samples"
        warn(f"iteration {iteration}: nothing to train on ({reason}; log: {logfile}); keeping the served policy")
    else:
        run.failures += 1
        run.failed_iteration = iteration
        outcome = f"failed (exit {code})"
        warn(f"iteration {iteration}: update failed ({run.failures} in a row); keeping the served policy")
        if run.failures >= run.args.max_failures:
            raise Die(
                1,
                f"{run.failures} updates failed in a row (--max-update-failures {run.args.max_failures}); "
                f"see {logfile}",
            )
    mark(run, iteration, "update", outcome)


def update_node(run: Run, cmd: list[str], logfile: Path) -> int:
    """One node's update: in the warm trainer (BATON_WARM_TRAINER=1), else, or when it cannot start, in fresh
    processes; `python -m training`'s exit code."""
    if WARM_TRAINER.value():
        if run.trainer is None:
            run.trainer = WarmTrainer(run)
        began = time.monotonic()
        watch_start(run, "update")
        try:
            code = run.trainer.update(cmd[cmd.index("update") + 1 :], logfile)
        finally:
            watch_stop(run)
        took = int(time.monotonic() - began)
        if code == 0:
            log(f"update: done in {took}s (warm trainer)")
        elif code is not None:
            warn(f"update failed (exit {code}) after {took}s; last lines of {logfile}:")
            print(tail(logfile), file=sys.stderr, flush=True)
        if code is not None:
            return code
    return run_group(run, "update", logfile, cmd)


def train_on(run: Run, members: list[int]) -> bool:
    """Train as one of `members` (torchrun's nodes: run.train_nodes, run.train_rank); False when this rank
    is not among them."""
    run.train_nodes = len(members)
    if run.rank in members:
        run.train_rank = members.index(run.rank)
        return True
    return False


def placement(run: Run) -> Placement:
    """Where this node's warm trainer runs in a several-node update: as the training's node run.train_rank of
    run.train_nodes (train_on), its store at the master's address and torchrun port."""
    node, nproc = run.node, placement_of(run.composed.update).nproc
    rank = run.rank if run.train_rank is None else run.train_rank
    nnodes = run.train_nodes or run.args.num_nodes
    return Placement(nproc, nnodes, rank, node.master_addr, node.torchrun_port, run.args.node_addr or "")


def in_trainer(run: Run, cmd: list[str], logfile: Path) -> int:
    """`cmd` (python -m training ...) as a job of this node's running warm trainer, else as fresh processes."""
    trainer = run.trainer
    if trainer is not None and trainer.running():
        return trainer.job(cmd[cmd.index("update") + 1 :], logfile)
    return run_group(run, "update", logfile, cmd)


def update_nodes(run: Run, iteration: int, logfile: Path, resume: bool) -> int:
    """The update on several nodes. The master prepares the dataset and tells the others whether to train, and
    in which generation of warm trainers (coordinator/driver/trainer.py; none: fresh processes); every node runs
    its torchrun node of the training; the master promotes; all wait for that. A training that failed on any
    node ends every node's warm trainer. The master's outcome: 0 promoted, 3 nothing to train, else failed."""
    node = run.node
    if run.trainer is None:
        run.trainer = WarmTrainer(run)
    code, train, sha, trained = 0, True, "", 0
    if node.is_master:
        if update_phase(run, iteration, resume) == "all":
            code = in_trainer(run, update_cmd(run, iteration, "prepare"), logfile)
            train = code == 0
        else:
            train = False  # --resume: trained already, promote only
        plan: dict = {"train": int(train), "prepare_exit": code}
        if node.continue_mode:  # the step's members that are still in: they train
            now = node.members(0, node.planned)
            plan["members"] = now.ranks
            train_on(run, now.ranks)
        if train:  # every node trains on exactly the files the master prepared
            plan["dataset_sha256"] = (run.layout.training_dir(iteration) / "dataset.sha256").read_text().strip()
            if (generation := run.trainer.plan(placement(run))) is not None:
                plan["trainer"] = list(generation)
        # the model trained from, which a --keep-best revert may have changed since the step's plan
        plan["version"] = run.policy_version()
        node.publish(iteration, "update_plan", plan)
        sha, warm = plan.get("dataset_sha256", ""), plan.get("trainer")
    else:
        decided = node.receive(iteration, "update_plan")
        if "version" in decided:
            run.pin_version = str(decided["version"])
        train, sha = bool(decided.get("train", 0)), str(decided.get("dataset_sha256", ""))
        if decided.get("members") and not train_on(run, [int(r) for r in decided["members"]]):
            train = False
        warm = decided.get("trainer")
    if train:
        node.watch_partners(iteration, lambda _rank, _code: stop_update(run))  # it says why
        cmd = update_cmd(run, iteration, "train", f"launch.dataset_sha256={sha}")
        try:
            code = train_part(run, cmd, logfile, warm)
        finally:
            node.unwatch_partners()
        trained = code
    if node.is_master and code == 0:
        code = in_trainer(run, update_cmd(run, iteration, "promote"), logfile)
    if node.is_master:
        synced = node.sync(iteration, "update", {"exit": code, "train_exit": trained, "version": run.policy_version()})
        end_failed_trainers(run, synced)
        return code
    # Serve the version the master promoted (its word, not policy/current, which NFS may show late).
    synced = node.sync(iteration, "update", {"train_exit": trained})
    end_failed_trainers(run, synced)
    decided = synced.data.get(0, {})
    run.pinned, run.pin_version = True, str(decided.get("version", ""))
    return int(decided.get("exit", 1))


def train_part(run: Run, cmd: list[str], logfile: Path, warm: list | None) -> int:
    """This node's part of the training: in its warm trainer of the plan's generation `warm` ([gen, new]), else
    (None: the master runs fresh processes) in fresh processes, the node's warm trainer stopped first."""
    trainer = run.trainer
    if warm is None:
        if trainer.alive():
            trainer.stop()
        return run_group(run, "update", logfile, cmd)
    gen, new = int(warm[0]), bool(warm[1])
    began = time.monotonic()
    watch_start(run, "update")
    try:
        if not trainer.join(gen, new, placement(run)):
            return Exit.FAILED
        code = trainer.job(cmd[cmd.index("update") + 1 :], logfile)
    finally:
        watch_stop(run)
    took = int(time.monotonic() - began)
    if code == 0:
        log(f"update: this node's part of the training done in {took}s (warm trainer)")
    else:
        warn(f"this node's part of the training failed (exit {code}) after {took}s; last lines of {logfile}:")
        print(tail(logfile), file=sys.stderr, flush=True)
    return code


def end_failed_trainers(run: Run, synced: Synced) -> None:
    """A training that failed on any node, or a rank the barrier went on without, leaves the process group of
    every node's warm trainer unusable (a partner gone, or stuck in a collective): end this node's, so that the
    next update starts a new generation."""
    failed = [r for r, data in synced.data.items() if str(data.get("train_exit", 0)) not in ("0", "")]
    failed += synced.gone
    if failed and run.trainer is not None and run.trainer.running():
        log(f"warm trainer: stopped (rank(s) {sorted(set(failed))} failed in this update; the next one starts anew)")
        run.trainer.stop()


def on_evicted(run: Run) -> None:
    """SIGUSR1 from the master's heartbeat: it evicted a rank (continue mode); a training that rank was part of
    would wait for it forever: stop it (the update fails, the served policy stays, the next iteration goes on)."""
    if run.update_running:
        warn(f"a rank of this training was evicted; stopping the update of iteration {run.update_running}")
        stop_update(run)


def stop_update(run: Run) -> None:
    """Stop a running update so that its training groups end too: SIGTERM makes python -m training stop the
    LLaMA-Factory and torchrun groups it started (within launch.grace_s); as a last resort SIGKILL the groups
    it listed in training/iter_<N>/*.log.pgid, each only while its pid names the recorded leader."""
    if run.trainer is not None and run.trainer.alive():  # its workers may wait in a collective, or to start
        run.trainer.stop()
    recorded = run.groups.recorded("update")
    if recorded is None:
        return
    pgid, start = recorded
    if procs.signal_group(pgid, start, signal.SIGTERM):
        deadline = time.monotonic() + 15
        while procs.group_ours(pgid, start) and procs.group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
    run.groups.stop("update", 5)
    if not run.update_running:
        return
    for listing in run.layout.training_dir(run.update_running).glob("*.log.pgid"):
        kill_listed(listing)
