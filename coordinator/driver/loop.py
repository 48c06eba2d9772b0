"""The steps of a run: the plan of each (the master decides, a worker receives it), then its phases.

    steps(run)    # check the update's config while vLLM starts, then every step until the plan says stop

A step of --rl-phase both is one iteration: train rollout, held-out rollout when due (then --keep-best),
update, serve the new policy, finish (metrics, plot, trackers, the end marker). --rl-phase rollout rolls
out one split per step with the newest promoted policy; --rl-phase update trains on each new train rollout.
"""

from __future__ import annotations

import time
from pathlib import Path

from coordinator import runstate
from coordinator.driver.context import Run, Step
from coordinator.driver.phase import mark, timed
from coordinator.driver.rollout import ensure_server, keep_best, rollout, serve_current
from coordinator.driver.say import Die, log, warn
from coordinator.driver.update import check_start, check_wait, update
from rollout_engine.defaults import UPDATE_POLL_S
from rollout_engine.shared_read import make_dirs


def steps(run: Run) -> None:
    check = check_start(run, runstate.next_iteration(run.log))
    if run.args.phase != "update":
        ensure_server(run)
    check_wait(run, check)
    number = 0
    while True:
        number += 1
        step = next_step(run, number)
        if step is None:
            last_update_failed(run)
            return
        if step.skip:
            continue
        if run.args.phase == "update":
            update(run, step.iteration, step.resume)
            run.done += 1
            continue
        one_step(run, step)


def last_update_failed(run: Run) -> None:
    """A run that did all it planned but whose last update failed ends with exit 1, never 0: the policy it
    leaves is not the one it was asked to train (the master counts the failures; a worker's is 0)."""
    n = run.failed_iteration
    if not n:
        return
    version = run.policy_version()
    logfile = run.layout.phase_log(run.rank, n, "update")
    raise Die(
        1,
        f"the run ended with its last update failed (iteration {n}: see {logfile}); "
        f"policy/current is unchanged ({'v' + version if version else 'the base model'}); the rollouts are kept "
        f"({run.layout.trajectories('train')})",
    )


def one_step(run: Run, step: Step) -> None:
    n = step.iteration
    begin(run, n, step.resume)
    if step.final:
        served = run.policy_version()
        log(f"final held-out evaluation of {'v' + served if served else 'the base model'}")
    if run.pinned:
        serve_current(run)
    served = run.policy_version()
    if step.train:
        rollout(run, "train", n, step.resume)
    if step.eval:
        rollout(run, "test", n, step.resume)
        if run.args.keep_best:
            keep_best(run, n)
    if step.update:
        update(run, n, step.resume)
        serve(run, n)
    finish(run, n, served)
    if step.final:
        run.final_done = True
    else:
        run.done += 1


# The plan -------------------------------------------------------------------------------------------


def next_step(run: Run, number: int) -> Step | None:
    """What step `number` of this run does; None when the run is over. The master (or a single node) decides
    and, on several nodes, publishes the plan; a worker waits for it: iteration numbers, --max-iterations,
    --resume and the policy version a rollout serves are the master's."""
    node = run.node
    if not node.is_master:
        return receive_step(run, number)
    step = Step(resume=run.args.resume)
    go = {"both": plan_both, "rollout": plan_rollout, "update": plan_update}[run.args.phase](run, step)
    if node.multi:
        if not go:
            node.publish(number, "plan", {"stop": 1})
            return None
        plan = {
            "iteration": step.iteration,
            "train": step.train,
            "eval": step.eval,
            "update": step.update,
            "final": step.final,
            "resume": step.resume,
            "version": run.policy_version(),
        }
        if node.continue_mode:
            members = node.members(number)
            node.plan_members(members)
            run.rank_weights = members.weights
            log(f"step {number}: ranks {','.join(map(str, members.ranks))} (rank weights {run.hydra_weights()})")
            plan["members"] = {str(r): list(i) for r, i in members.incarnations.items()}
            plan["weights"] = members.weights
        node.publish(number, "plan", plan)
    return step if go else None


def receive_step(run: Run, number: int) -> Step | None:
    node = run.node
    plan = node.receive(number, "plan")
    if plan.get("stop"):
        return None
    if node.continue_mode:
        members = {int(r): tuple(i) for r, i in plan.get("members", {}).items()}
        if members.get(run.rank) != tuple(node.me):
            # planned without this node (before it joined, or it was evicted since): the next step may have it
            log(f"rank {run.rank}: step {number} was planned without this node; waiting for the next")
            return Step(skip=True)
        node.planned = {r: i for r, i in members.items() if r != 0}
    if plan.get("weights"):
        run.rank_weights = [int(w) for w in plan["weights"]]
    step = Step(
        iteration=int(plan["iteration"]),
        train=bool(plan["train"]),
        eval=bool(plan["eval"]),
        update=bool(plan["update"]),
        final=bool(plan["final"]),
        resume=bool(plan["resume"]),
    )
    # The policy version this step serves and fine-tunes is the master's ("" for the base model).
    run.pinned, run.pin_version = True, str(plan.get("version", ""))
    return step


def more(run: Run) -> bool:
    """Fewer than --max-iterations ran (always true without it)."""
    return run.args.max_iterations is None or run.done < run.args.max_iterations


def plan_both(run: Run, step: Step) -> bool:
    """Train rollout, eval when due, update; after --max-iterations, the --final-eval step (a test rollout)."""
    if more(run):
        step.iteration = runstate.next_iteration(run.log)
        step.train = step.update = True
        step.eval = runstate.eval_due(step.iteration, run.args.eval_interval)
        return True
    if run.args.final_eval and not run.final_done:
        step.iteration = runstate.next_iteration(run.log)
        step.eval = step.final = True
        return True
    return False


def plan_rollout(run: Run, step: Step) -> bool:
    """One rollout of --rollout-split per step, with the newest promoted policy (from an update run on this
    log path); the step keeps that version (the plan names it to the workers) even if a newer one comes."""
    if not more(run):
        return False
    step.iteration = runstate.next_iteration(run.log)
    step.eval = run.args.split == "eval-only"
    step.train = not step.eval
    run.pinned = False
    serve_current(run)
    run.pinned, run.pin_version = True, run.served_version or ""
    return True


def plan_update(run: Run, step: Step) -> bool:
    """The newest train rollout not trained on yet; with nothing new, wait (polling) at most --wait-timeout."""
    if not more(run):
        return False
    poll, since, said = UPDATE_POLL_S.value(), time.monotonic(), -1.0
    wait = run.args.wait_timeout
    while (n := untrained(run)) is None:
        waited = time.monotonic() - since
        if wait is not None and waited >= wait:
            wait_expired(run, int(waited))
            return False
        if said < 0 or waited - said >= 600:
            log(
                f"waiting for a new train rollout under {run.layout.trajectories('train')} (from --rl-phase rollout "
                f"--rollout-split train-only on this log path); checking every {poll}s, waited {int(waited)}s"
                + (f" of {wait}" if wait is not None else "")
            )
            said = waited
        run.supervisor.sleep(poll if wait is None else max(0.0, min(poll, wait - waited)))
    step.iteration, step.update = n, True
    return True


def untrained(run: Run) -> int | None:
    """The newest iteration with a finished train rollout and no update yet."""
    for n in sorted(runstate.state_iterations(run.log), reverse=True):
        if runstate.is_done(run.log, n, "update"):
            return None
        if runstate.is_done(run.log, n, "train_rollout"):
            return n
    return None


def wait_expired(run: Run, waited: int) -> None:
    """--wait-timeout ran out: fine after at least one update, an error when there was never anything to train."""
    if run.done > 0:
        log(
            f"no new train rollout for {waited}s (--wait-timeout {run.args.wait_timeout}); "
            f"stopping after {run.done} update(s)"
        )
        return
    raise Die(
        1,
        f"no train rollout to train on under {run.log} after {waited}s (--wait-timeout {run.args.wait_timeout}); "
        "run --rl-phase rollout --rollout-split train-only (or both) on this log path first, or wait longer",
    )


# An iteration's edges -------------------------------------------------------------------------------


def begin(run: Run, n: int, resume: bool) -> None:
    """Create the iteration's state with its resolved config (the master's)."""
    run.iteration, run.phase = n, "begin"
    if run.node.is_master:
        run.node.fence(f"beginning iteration {n}")
        if not resume and runstate.restart(run.log, n):
            warn(f"iteration {n} was interrupted; starting it again (pass --resume to continue it)")
        folder = run.layout.state_dir(n)
        make_dirs(folder)
        from rollout_engine.files import save_bytes

        save_bytes(folder / "config.yaml", run.layout.resolved(run.rank).read_bytes(), durable=False)
    if run.node.multi:
        log(f"iteration {n} ({run.args.phase}, rank {run.rank} of {run.args.num_nodes})")
    else:
        log(f"iteration {n} ({run.args.phase})")


def serve(run: Run, n: int) -> None:
    """Serve the promoted policy before the next iteration (each node its own; the master's marker is
    skipped on --resume)."""
    if run.node.is_master and runstate.is_done(run.log, n, "serve"):
        return
    with timed(run, n, "serve"):
        serve_current(run)
    mark(run, n, "serve", run.serve_how or "no new policy")


def finish(run: Run, n: int, served: str) -> None:
    """The metrics record, plot, trackers, and the iteration's end marker (the master's)."""
    run.phase = "finish"
    if not run.node.is_master:
        log(f"iteration {n} done on rank {run.rank}")
        return
    from coordinator.plot import save_plot
    from coordinator.summary import summarize, summary_line
    from rollout_engine.metrics_log import merge_update

    line = plot = ""
    try:  # the update's records into metrics.jsonl, whose one writer this master is (rollout_engine.metrics_log)
        merge_update(run.log)
    except OSError as exc:  # load_metrics still reads them from the update's file; the next step merges them
        warn(f"could not merge the update's records into metrics.jsonl ({exc})")
    try:
        line = summary_line(summarize(Path(run.log), n, int(served) if served else None))
    except Exception as exc:  # the record is derived data: the next iteration's summary still comes
        warn(f"could not summarize iteration {n} ({exc})")
    try:
        plot = str(save_plot(Path(run.log)) or "")
    except Exception as exc:
        warn(f"could not draw the plot ({exc})")
    if run.composed.trackers:
        # its own process: a tracker's client (wandb) may start services and hang on the network
        cmd = [run.pythons.app, "-m", "coordinator", "track", "--log-path", run.log]
        logfile = run.layout.logs_dir(run.rank) / "track.log"
        if run.supervisor.wait(run.groups.start("track", cmd, logfile, env=run.env())) != 0:
            warn(
                f"could not log iteration {n} to the trackers ({','.join(run.composed.trackers)}; see {logfile}); "
                "the next iteration logs it"
            )
        run.groups.forget("track")
    run.node.fence(f"marking the end of iteration {n}")
    runstate.mark(run.log, n, "iteration")
    if line:
        log(line)
    log(f"iteration {n} done; metrics: {run.log}/metrics.jsonl, plot: {plot or 'none'}")
