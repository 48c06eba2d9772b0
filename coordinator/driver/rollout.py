"""A rollout phase: this rank's share (resumed after a policy server that stopped answering), the barrier,
a continue run's takeover of a lost rank's episodes, the master's merge; and --keep-best after a held-out one."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from coordinator import runstate
from coordinator.driver.context import Run
from coordinator.driver.phase import mark, run_group, timed, watch_start, watch_stop
from coordinator.driver.say import Die, log, warn
from coordinator.driver.supervise import EXPIRED
from rollout_engine.defaults import POLICY_RESTARTS, ROLLOUT_STALL_S, ROLLOUT_TIMEOUT_S
from rollout_engine.exits import Exit
from rollout_engine.layout import iteration_name

#: seconds the policy server has to answer a model list (a hung vLLM accepts connections and never answers)
ANSWER_S = 10.0


def rollout_cmd(run: Run, split: str, iteration: int, resume: bool) -> list[str]:
    cmd = [run.pythons.app, "-m", "rollout_engine", "--config-name", f"rollout_{split}"]
    cmd += [f"data_path={run.args.data}", f"log_path={run.log}", f"iteration={iteration}", f"rank={run.rank}"]
    cmd += [f"rank_weights={run.hydra_weights()}", f"policy_config.base_url={run.composed.base_url}"]
    if not run.args.debug:
        cmd.append(f"policy_config.model={run.composed.model}")
        if run.policy_version():
            cmd.append(f"policy_version={run.policy_version()}")
    if resume:
        cmd.append("resume=true")
    # this node's context, resolved (auto decided, the node file's value in): the rollout's config says what
    # its server serves, and checks policy_config.max_new_tokens against it as run.sh did
    node = [f"vllm_config.max_model_len={run.composed.vllm.max_model_len}"] if run.composed.vllm else []
    return cmd + run.composed.rollout + node


def progress(run: Run, split: str, iteration: int) -> list[tuple[str, int]]:
    """What changes when this rank's rollout finishes an episode: its journals' sizes (main and takeovers)."""
    folder = run.layout.iteration_dir(split, iteration)
    found = []
    for path in sorted(folder.glob(f"rank_{run.rank}.*jsonl")):
        try:
            found.append((path.name, path.stat().st_size))
        except OSError:
            continue
    return found


def policy_answers(run: Run) -> bool:
    """The policy server answers a model list within ANSWER_S seconds."""
    try:
        with urllib.request.urlopen(f"{run.composed.base_url.rstrip('/')}/models", timeout=ANSWER_S):
            return True
    except OSError:
        return False


def survivors(run: Run, gone: list[int]) -> list[int]:
    """The ranks with a share this step (weight > 0) that are not in `gone`."""
    return [rank for rank, weight in enumerate(run.rank_weights) if weight != 0 and rank not in gone]


def rollout(run: Run, split: str, iteration: int, resume: bool) -> None:
    """One rollout phase (skipped when done; resumed with --resume). On several nodes each rolls out its
    share, then waits for the others; the master merges their journals' metrics."""
    phase = f"{split}_rollout"
    if runstate.is_done(run.log, iteration, phase):
        return
    start = time.monotonic()
    journal = run.layout.journal(split, iteration, run.rank)
    resumed = resume and journal.is_file() and journal.stat().st_size > 0
    with timed(run, iteration, phase):
        gone = rollout_run(run, split, iteration, resumed)
    if run.node.multi:
        plan: Path | None = None
        if run.node.continue_mode:
            with timed(run, iteration, f"{split}_takeover"):
                plan = takeover(run, split, iteration, gone)
        if not run.node.is_master:
            return
        from coordinator.aggregate import aggregate

        try:
            record = aggregate(
                Path(run.log), split, iteration, run.args.num_nodes, time.monotonic() - start, plan, survivors(run, [])
            )
        except Exception as exc:
            raise Die(1, f"could not merge the ranks' {split} rollouts of iteration {iteration} ({exc})") from exc
        if split == "train" and not record.get("complete", True):
            # the update would refuse it; left unmarked, a resume rolls the phase out again (each rank's sealed
            # journal is kept, nothing is done twice) and merges it again
            manifest = run.layout.merged_manifest(split, iteration)
            raise Die(
                1,
                f"the merge of the ranks' train rollouts of iteration {iteration} is not complete (a journal missing,"
                f" unsealed or not as sealed: {manifest}); start every node again with --resume to merge it again",
            )
    mark(run, iteration, phase)


def rollout_run(run: Run, split: str, iteration: int, resume: bool) -> list[int]:
    """Run this rank's rollout, then (several nodes) the barrier; the ranks it went on without. When the policy
    server stops answering under the rollout (exit 75), restart vLLM and resume, at most BATON_POLICY_RESTARTS
    times (not in debug mode: the server is not ours)."""
    logfile = run.layout.phase_log(run.rank, iteration, split)
    restarts, limit = 0, POLICY_RESTARTS.value()
    while True:
        code = run_group(
            run,
            f"rollout-{split}",
            logfile,
            rollout_cmd(run, split, iteration, resume),
            total_s=ROLLOUT_TIMEOUT_S.value(),
            stall_s=ROLLOUT_STALL_S.value(),
            progress=lambda: progress(run, split, iteration),
        )
        # The engine's start-up probe calls an unreachable server bad input (exit 2); ours answered a moment ago.
        if code == Exit.BAD_INPUT and not run.args.debug and not policy_answers(run):
            warn(f"the {split} rollout found the policy server unreachable at its start: it died meanwhile")
            code = Exit.POLICY_DOWN
        if code not in (Exit.POLICY_DOWN, EXPIRED) or restarts >= limit:
            break
        restarts += 1
        if code == EXPIRED and policy_answers(run):
            warn(
                f"the {split} rollout was stuck while the policy server answers; resuming it "
                f"(restart {restarts} of {limit})"
            )
        elif run.args.debug or run.server is None:
            warn(
                f"the policy server {run.composed.base_url} stopped answering during the {split} rollout (debug mode: "
                "it is not ours to restart)"
            )
            break
        else:
            warn(
                f"the policy server stopped answering during the {split} rollout; restarting vLLM and resuming "
                f"(restart {restarts} of {limit})"
            )
            run.server.stop()
            ensure_server(run)
        resume = True
    if code != 0:
        raise Die(1, f"the {split} rollout of iteration {iteration} failed; fix the cause, then rerun with --resume")
    if not run.node.multi:
        return []
    watch_start(run, f"rollout-{split}")  # the other ranks, while this one waits for them
    try:
        return run.node.sync(iteration, phase_name(split)).gone
    finally:
        watch_stop(run)


def phase_name(split: str) -> str:
    return f"{split}_rollout"


def takeover(run: Run, split: str, iteration: int, dropped: list[int]) -> Path | None:
    """A continue run's second round: the master re-assigns the unfinished episodes of the ranks the rollout
    barrier went on without (their journals cut where they stand) to the survivors, who roll them out
    (rank_<r>.takeover_<d>.jsonl); every rank learns the decision, then waits for the others. A rank lost
    during the takeover ends the run (--resume). Returns the plan's path (None: nothing to take over)."""
    node = run.node
    plan = ""
    if node.is_master:
        shared = survivors(run, [])
        gone = [rank for rank in dropped if rank in shared]  # a rank out of the step has no share
        if gone:
            plan = plan_takeover(run, split, iteration, gone)
        node.publish(iteration, f"{split}_takeover", {"plan": plan})
    else:
        plan = str(node.receive(iteration, f"{split}_takeover").get("plan", ""))
    if not plan:
        return None
    cmd = [*rollout_cmd(run, split, iteration, True), f"takeover_plan={plan}"]
    logfile = run.layout.logs_dir(run.rank) / f"{iteration_name(iteration)}.{split}.takeover.log"
    if run_group(run, f"rollout-{split}", logfile, cmd) != 0:
        raise Die(1, f"the {split} takeover of iteration {iteration} failed; fix the cause, then rerun with --resume")
    lost = [rank for rank in node.sync(iteration, f"{split}_takeover_done").gone if rank not in dropped]
    if lost:
        ranks = ",".join(map(str, lost))
        raise Die(
            1,
            f"ranks {ranks} were lost during the {split} takeover of iteration {iteration}; restart them, then "
            "every node with --resume",
        )
    return Path(plan)


def plan_takeover(run: Run, split: str, iteration: int, gone: list[int]) -> str:
    """The master cuts the lost ranks' journals and re-assigns their unfinished episodes (takeover.json)."""
    from omegaconf import OmegaConf

    from coordinator.reassign import plan_takeover as plan_it
    from rollout_engine.config import validate
    from rollout_engine.layout import rollout_config_name

    config = run.layout.iteration_dir(split, iteration) / rollout_config_name(run.rank)
    alive = survivors(run, gone)
    try:
        cfg = validate(OmegaConf.load(config))
        plan = plan_it(cfg, gone, alive)
    except Exception as exc:
        raise Die(
            1, f"could not re-assign the {split} episodes of ranks {gone} (iteration {iteration}): {exc}"
        ) from exc
    shares = "; ".join(
        f"{dead} {entry.cut.lines} " + ",".join(f"{s}:{len(ids)}" for s, ids in sorted(entry.assignments.items()))
        for dead, entry in sorted(plan.dead.items())
    )
    log(
        f"iteration {iteration}: the unfinished {split} episodes of ranks {','.join(map(str, gone))} go to ranks "
        f"{','.join(map(str, alive))} (dead rank, journal lines kept, survivor:episodes: {shares})"
    )
    return str(run.layout.takeover_plan(split, iteration))


def ensure_server(run: Run) -> None:
    """Serve the current policy. A recorded server that still answers on this port with the served name is
    reused, and given the current policy's weights unless it recorded holding them."""
    server = run.server
    if run.args.debug or server is None:
        return
    if server.reuse():
        if server.recorded_weights() == run.policy_path():
            run.served_version = run.policy_version()
            log(f"it holds the current policy's weights ({run.policy_path()}) already")
        else:
            run.served_version = "unknown"
        serve_current(run)
        return
    server.start(run.policy_path())
    run.served_version = run.policy_version()


def serve_current(run: Run) -> None:
    """Make vLLM serve the current (or pinned) policy; run.serve_how says how ("" when nothing was to do)."""
    run.serve_how = ""
    version = run.policy_version()
    if version == (run.served_version or ""):
        return
    if run.args.debug or run.server is None:
        warn(f"debug mode: the external server keeps its weights; policy v{version} is at {run.layout.policy_current}")
        run.served_version, run.serve_how = version, "external server not reloaded"
        return
    how = run.server.serve_new(run.policy_path())
    run.served_version, run.serve_how = version, f"v{version} by {how}"


def keep_best(run: Run, iteration: int) -> None:
    """--keep-best, after the held-out rollout of `iteration`, on the master: when the evaluated policy is worse
    than the best one so far by more than --keep-best-margin points, promote the best's weights as a new
    version (`python -m training phase=revert`, group `revert`). A resumed iteration that reverted already is
    not reverted again (the decision says `done`)."""
    if not run.node.is_master:
        return
    from coordinator.keep_best import decide_and_mark

    try:
        decision = decide_and_mark(Path(run.log), iteration, float(run.args.keep_best_margin), run.base_model)
    except Exception as exc:
        raise Die(1, f"iteration {iteration}: --keep-best could not decide ({exc}); rerun with --resume") from exc
    if decision.action != "revert":
        if decision.message:
            log(f"iteration {iteration}: {decision.message}")
        return
    logfile = run.layout.phase_log(run.rank, iteration, "revert")
    cmd = [run.pythons.train, "-m", "training", "--config-name", "update", f"log_path={run.log}"]
    cmd += [f"iteration={iteration}", f"model_path={decision.source}", "phase=revert"]
    cmd += [f"revert.to_version={decision.best}", f"revert.replaced={decision.served}"]
    cmd += [f"revert.replaced_success_rate={decision.served_rate}", f"revert.best_success_rate={decision.best_rate}"]
    cmd += [f"revert.margin_points={run.args.keep_best_margin}", *run.composed.update]
    what = "the base model" if str(decision.best) == "0" else f"v{decision.best}"
    if run_group(run, "revert", logfile, cmd) != 0:
        raise Die(1, f"iteration {iteration}: the revert to {what} failed (see {logfile}); rerun with --resume")
    log(f"{decision.message} as v{run.policy_version()} (--keep-best)")
