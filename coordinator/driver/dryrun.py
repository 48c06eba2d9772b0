"""--dry-run: validate what a real run validates before it starts anything (the configuration, composed by
run.main; the update's, checked in the train environment; the policy server's command line, checked by vLLM's
own parser in the serve environment), then print the commands the next iteration's phases would run. Nothing
is started but those checks, nothing is written under the log path."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from coordinator import runstate
from coordinator.driver import cli
from coordinator.driver.context import Run
from coordinator.driver.phase import dashboard_cmd
from coordinator.driver.rollout import rollout_cmd
from coordinator.driver.say import Die
from coordinator.driver.shellquote import line
from coordinator.driver.update import check_key, check_verdict, update_cmd
from coordinator.driver.vllm import PolicyServer
from coordinator.driver.vllm_settings import blame
from rollout_engine.defaults import CHECK_TIMEOUT_S

#: seconds the serve environment may take to import vLLM's parser and check the server's command line
ARGCHECK_S = 300


def check(run: Run, n: int) -> str:
    """The update-check a real run starts before its first rollout or update (update.check_start: a run that
    trains, on the master; skipped where it passed before with the same command, environment and code),
    run here to its end: a rejection exits 2 with the real run's message. Its log goes to a temporary file,
    removed when the check passes."""
    if run.args.phase == "rollout" or not run.node.is_master:
        return ""
    cmd = update_cmd(run, n, "check")
    ok = run.run_dir / "update-check.ok"
    if ok.is_file() and ok.read_text().strip() == check_key(run, cmd):
        return "update-check: passed before with this command, environment and code"
    fd, name = tempfile.mkstemp(prefix="baton-dry-run-update-check-", suffix=".log")
    logfile, limit = Path(name), CHECK_TIMEOUT_S.value()
    with os.fdopen(fd, "w") as out:
        try:
            done = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=run.env(), timeout=limit
            )
        except subprocess.TimeoutExpired:
            raise Die(
                1,
                f"the check of the update configuration did not finish within {limit}s (BATON_CHECK_TIMEOUT_S); "
                f"stopped it. Its log: {logfile}",
            ) from None
    chosen = check_verdict(done.returncode, logfile)
    logfile.unlink()
    return chosen


def check_serve(server: PolicyServer, model: str) -> None:
    """Parse the server's command line (after `choose`) with vLLM's own parser and its checks, in the serve
    environment with the command's variables (coordinator/vllm_argcheck.py), as a real start would: a refusal
    exits 2 with vLLM's words and the setting to fix; a check that cannot run exits 1."""
    script = Path(__file__).resolve().parents[1] / "vllm_argcheck.py"
    check = server.command(model, entry=["-I", str(script)])
    try:
        done = subprocess.run(check, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=ARGCHECK_S)
    except subprocess.TimeoutExpired:
        raise Die(1, f"vLLM's parser did not check the server's command line within {ARGCHECK_S}s") from None
    marked = [line.removeprefix("refused: ") for line in done.stdout.splitlines() if line.startswith("refused: ")]
    if done.returncode == 2 and marked and server.settings is not None:
        raise Die(
            2,
            f"vLLM's parser refuses the server's command line: {marked[-1]}; set {blame(marked[-1], server.settings)}"
            " to what vLLM takes (docs/serving.md)",
        )
    if done.returncode != 0:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        raise Die(
            1,
            f"could not check the server's command line with vLLM's parser ({server.serve_py} exited "
            f"{done.returncode}: {tail}); is the serve environment whole? (bash scripts/setup.sh)",
        )


def dry_run(run: Run) -> None:
    a = run.args
    n = runstate.next_iteration(a.log)
    chosen = check(run, n)
    env = ["env", f"PYTHONPATH={run.env()['PYTHONPATH']}"]
    out = [f"# iteration {n}, --rl-phase {a.phase} (dry run: nothing started or written)"]
    record = run.model_record
    out.append(f"# model: {record['wanted']} ({record['path']}, {record['source']}; reasoning {record['reasoning']})")
    if chosen:
        out.append(f"# {chosen}")
    if cli.slurm_describe(a):
        out.append(f"# {cli.slurm_describe(a)}")
    if run.node.multi:
        out.append(
            f"# rank {a.rank} of {a.num_nodes}; the master (rank 0) numbers the iterations"
            " and chooses the torchrun port"
        )
        run.node.master_addr, run.node.torchrun_port = "<master address>", "<torchrun port>"  # type: ignore[assignment]
    if a.phase != "rollout":
        out.append(
            line("update-check (once per run, before the first rollout or update)", env + update_cmd(run, n, "check"))
        )
    if a.phase != "update" and run.server is not None:
        run.server.choose(run.policy_path(), record=False)
        check_serve(run.server, run.policy_path())
        out.append(line("serve", run.server.command(run.policy_path())))
    if a.phase == "both" or a.split == "train-only":
        out.append(line("train rollout", env + rollout_cmd(run, "train", n, a.resume)))
    if a.split == "eval-only" or (a.phase == "both" and runstate.eval_due(n, a.eval_interval)):
        out.append(line("eval rollout", env + rollout_cmd(run, "test", n, a.resume)))
    if a.keep_best and run.node.is_master:
        cmd = [run.pythons.app, "-m", "coordinator", "keep-best", "--log-path", a.log, "--iteration", str(n)]
        cmd += ["--margin", a.keep_best_margin, "--base-model", run.base_model]
        out.append(
            line(
                "keep-best (after each held-out rollout; a worse policy: python -m training ... phase=revert)",
                env + cmd,
            )
        )
    if a.final_eval:
        out.append(
            line("final eval rollout (after the last iteration)", env + rollout_cmd(run, "test", "<last+1>", False))
        )  # type: ignore[arg-type]
    if a.phase != "rollout" and run.node.multi:
        label = (
            "update (this node's part of one torchrun; the master runs phase=prepare before and phase=promote after)"
        )
        out.append(line(label, env + update_cmd(run, n, "train")))
    elif a.phase != "rollout":
        out.append(line("update", env + update_cmd(run, n, "all")))
    if a.dashboard_port is not None:
        out.append(line("dashboard (for the whole run)", env + dashboard_cmd(run)))
    if a.phase == "both" and not a.debug:
        out.append(
            f"[serve new policy] POST http://127.0.0.1:{run.port}/collective_rpc "
            f'{{"method":"reload_weights","kwargs":{{"weights_path":"{a.log}/policy/v<NNNN>"}}}}; '
            "POST /reset_prefix_cache (restart if the outputs do not change)"
        )
    print("\n".join(out))
