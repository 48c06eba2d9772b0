"""run.sh's main: --help, --stop, --dry-run, or a run — owned from its claims to its clean-up.

Bad input exits 2 before anything starts or is written; Ctrl+C / SIGTERM stop every process group this
run started and exit 130 / 143; on several nodes a node's failure is flagged for the others on its way out.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from types import FrameType

from coordinator import runstate
from coordinator.driver import cli, procs
from coordinator.driver.context import Composed, Pythons, Run
from coordinator.driver.nodes import Node, spread_start
from coordinator.driver.phase import dashboard_cmd
from coordinator.driver.procs import Groups
from coordinator.driver.resume import check_resume
from coordinator.driver.say import BadInput, Die, Ended, error_lines, log
from coordinator.driver.supervise import Supervisor
from coordinator.driver.vllm import PolicyServer
from coordinator.model import Found, load_model_record, mismatch, model_record, reasoning_of
from coordinator.overrides import Request, override_key
from rollout_engine.config import ModelConfig
from rollout_engine.defaults import VLLM_PORT
from rollout_engine.layout import Layout
from rollout_engine.shared_read import make_dirs

ROOT = str(Path(__file__).resolve().parents[2])


def main(argv: list[str]) -> int:
    try:
        args = cli.parse(argv)
        if args.help:
            print(cli.usage())
            return 0
        if args.stop:
            from coordinator.driver.stop import stop_run

            stop_run(args, ROOT)
            return 0
        if args.check_shared_fs:
            from coordinator.driver.fscheck_cmd import check_shared_fs

            return check_shared_fs(args)
        cli.validate(args)
        cli.apply_node_file(args)
        cli.slurm_default_addr(args)
        if args.dry_run:
            from coordinator.driver.dryrun import dry_run

            dry_run(build(args))
            return 0
        with tempfile.TemporaryDirectory() as tmp:
            resolved = Path(tmp) / "resolved.yaml"
            run = build(args, resolved)
            spread_start(args.rank, args.num_nodes)  # checked, composed, nothing written yet
            return execute(run, resolved)
    except Ended as exc:
        for line in error_lines(exc):
            print(line, file=sys.stderr, flush=True)
        return exc.code
    except KeyboardInterrupt:  # before the run's own handlers (a Ctrl+C during the spread start)
        return 130


def request_of(args: cli.Args, base_model: str = "") -> Request:
    weights = "[" + ",".join(map(str, args.weights)) + "]"
    return Request(
        args.data, args.log, base_model, list(args.overrides), args.debug, args.rank, weights, args.num_nodes
    )


def find(args: cli.Args, pythons: Pythons) -> tuple[Found, ModelConfig]:
    """The model model_config asks for, on this node (downloaded into the data path's Hugging Face cache when
    no cache holds it; not by a dry run, which stops there), and its settings; bad input exits 2."""
    from coordinator.model import ModelNotFound, download, find_model, model_problems
    from coordinator.overrides import model_settings
    from rollout_engine.errors import ConfigError

    try:
        settings = model_settings(request_of(args))
        found = find_model(args.data, settings)
        if found.source == "download" and args.dry_run:
            raise Ended(
                0,
                f"# model_config.model={found.wanted} is in no Hugging Face cache yet: a run downloads "
                f"it into {found.cache} first; the dry run stops here",
            )
        if found.source == "download":
            log(f"downloading {found.wanted} into {found.cache} (no Hugging Face cache holds it)")
            found = download(found, args.data, pythons.train, {**os.environ})
    except (ConfigError, ModelNotFound) as exc:
        raise Die(2, "\n[baton] error: ".join(getattr(exc, "problems", None) or [str(exc)])) from exc
    if found.source != "shipped" or (found.path / "config.json").is_file():
        key = "model_config.model_type" if settings.model_type and not settings.model else "model_config.model"
        if problems := model_problems(found.path, key):
            raise Die(2, "\n[baton] error: ".join(problems))
    return found, settings


def compose(args: cli.Args, base_model: str, save: Path | None) -> Composed:
    """Compose every config once with this rank's keys and node-file vllm_config (the overrides' only
    validation), resolve vllm_config for this node when this run serves the policy (vllm_settings.for_node:
    the parallel sizes against the node, the context against max_new_tokens); save the resolved config."""
    from coordinator.driver.vllm_settings import Machine, for_node
    from coordinator.overrides import route_and_compose
    from rollout_engine.errors import ConfigError

    request = request_of(args, base_model)
    # the splits this run rolls out: their task files and environment are checked now, before anything starts
    request.rollout_splits = {"both": ("train", "test"), "update": ()}.get(
        args.phase, ("train",) if args.split == "train-only" else ("test",)
    )
    request.vllm = dict(args.node_vllm)
    vllm = None
    try:
        routed = route_and_compose(request)
        if problem := images_problem(routed.resolved, Path(base_model)):
            raise ConfigError(problem)
        if not args.debug and args.phase != "update":
            machine = Machine.detect()
            vllm = for_node(routed.vllm, Path(base_model), args.log, routed.max_new_tokens, machine)
            log(vllm.describe(machine))
    except ConfigError as exc:
        raise Die(2, "\n[baton] error: ".join(exc.problems)) from exc
    if save is not None:
        from omegaconf import OmegaConf

        from rollout_engine.files import save_text

        save_text(save, OmegaConf.to_yaml(OmegaConf.create(routed.resolved)))
    trackers = [name for name, on in routed.resolved["update"]["tracker"].items() if on]
    return Composed(
        routed.rollout, routed.update, routed.policy_base_url, routed.policy_model, routed.max_sessions, trackers, vllm
    )


def images_problem(resolved: dict, model: Path) -> str:
    """Why an environment that shows the model images (env.observation screenshot or both) cannot run with this
    model: a text model's server refuses images (HTTP 400 on every request); "" when it can."""
    from rollout_engine.vision import is_vision_language

    shown = {c.get("env", {}).get("observation", "text") for n, c in resolved.items() if n.startswith("rollout")}
    shown.discard("text")
    if not shown:
        return ""
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return ""  # the model's own checks say what is wrong with its folder
    if is_vision_language(config):
        return ""
    return (
        f"env.observation={sorted(shown)[0]} shows the model screenshots, but {model} is a text model (no "
        "vision_config in its config.json); set env.observation=text, or model_config.model to a vision-language "
        "model (docs/models.md)"
    )


def build(args: cli.Args, save: Path | None = None) -> Run:
    """The run's state: paths, port, the composed configuration, its children's owners."""
    pythons = Pythons.from_env()
    found, settings = find(args, pythons)
    base_model = str(found.path)
    reasoning = reasoning_of(found.path, settings.reasoning) if (found.path / "config.json").is_file() else "auto"
    # the rollouts split replies as this model writes them (model_config.reasoning auto, resolved here)
    args.overrides = [o for o in args.overrides if override_key(o) != "model_config.reasoning"]
    args.overrides.insert(0, f"model_config.reasoning={reasoning}")
    composed = compose(args, base_model, save)
    record = model_record(found, settings, composed.vllm.max_model_len if composed.vllm else None)
    if why := mismatch(load_model_record(args.log), record, args.log):
        raise BadInput(why)
    if args.resume:
        check_resume(Layout(args.log), args.rank)
    port = VLLM_PORT.value()
    if not args.debug:
        composed.base_url = f"http://127.0.0.1:{port}/v1"
    run_dir = Layout(args.log).rank_dir(args.rank)
    groups, supervisor = Groups(run_dir), Supervisor()
    node = Node(args, run_dir, groups, supervisor, ROOT, pythons.app, port)
    server = None
    if not args.debug:
        server = PolicyServer(
            run_dir, port, composed.model, groups, supervisor, pythons.serve, composed.max_sessions, composed.vllm
        )
    run = Run(args, ROOT, pythons, composed, groups, supervisor, node, server, base_model, port)
    run.model_record = record
    run.rank_weights = list(args.weights)
    run.watch_name = "watch-update" if args.phase == "update" else "watch"
    roles = {"both": ["rollout", "update"], "rollout": ["rollout"], "update": ["update"]}[args.phase]
    names = {
        "both": ["update", "trainer", "update-check", "revert", "rollout-train", "rollout-test", "vllm"],
        "rollout": ["rollout-train", "rollout-test", "vllm"],
        "update": ["update", "trainer", "update-check"],
    }[args.phase]
    run.group_names = [*names, "track", run.watch_name]
    if args.dashboard_port is not None:
        run.dashboard_name = run.watch_name.replace("watch", "dashboard")
        run.group_names.append(run.dashboard_name)
    run.roles = roles
    return run


def execute(run: Run, resolved: Path) -> int:
    """A run: claim its roles, install the signal handlers, run the steps; clean up whatever happened."""
    if not run.args.debug and not (Path(run.policy_path()) / "config.json").is_file():
        raise BadInput(
            f"no model to serve at {run.policy_path()} (config.json missing); "
            f"run: bash scripts/prepare.sh --data-path {run.args.data}"
        )
    code = 0
    try:
        # first: a claim may stop what a dead run left (seconds a group), and a signal then must end the run
        # through its clean-up, not kill it with those groups half stopped
        install_signals(run)
        claim(run)
        make_dirs(run.run_dir / "logs")
        from rollout_engine.files import overwrite_bytes

        # in place: one create at a node's first start, none at a --resume (this node's own run reads it, after)
        overwrite_bytes(run.layout.resolved(run.rank), resolved.read_bytes())
        a = run.args
        log(f"run: --rl-phase {a.phase}, log path {a.log}, policy {run.composed.base_url} ({run.composed.model})")
        dashboard_start(run)
        if cli.slurm_describe(a):
            log(cli.slurm_describe(a))
        pin_model(run)
        run.node.start(runstate.next_iteration(a.log))
        pin_model(run)
        from coordinator.driver.loop import steps

        steps(run)
        log(f"run finished: {a.log}/metrics.jsonl, {a.log}/plots/success.png")
    except Ended as exc:
        for line in error_lines(exc):
            print(line, file=sys.stderr, flush=True)
        if isinstance(exc, Die):
            run.last_error = exc.message
        code = exc.code
    except Exception:
        traceback.print_exc()
        run.last_error = "internal error in the driver (traceback above)"
        code = 1
    return cleanup(run, code)


def pin_model(run: Run) -> None:
    """Record the model this log path serves and trains (its first start, a master or a single node), or check
    this node's against the record: a worker checks again once it has joined (the master writes the record
    before it opens the run)."""
    from coordinator.model import save_model_record

    pinned = load_model_record(run.log)
    if why := mismatch(pinned, run.model_record, run.log):
        raise BadInput(why)
    if pinned is None and run.node.is_master:
        save_model_record(run.log, run.model_record)
        log(f"model: {run.model_record['wanted']} ({run.model_record['path']}), recorded in {run.layout.model}")


def claim(run: Run) -> None:
    """Own this run's roles in this rank's run directory; a live run.sh of the same role there is bad input.
    A run of these roles that died may have left its children running: stop them (a healthy vLLM is reused)."""
    for role in run.roles:
        try:
            procs.claim(run.run_dir, role)
        except procs.Claimed as exc:
            release(run)
            raise BadInput(
                f"another run.sh (pid {exc.owner_pid}) is running the {role} phase of rank {run.rank} on --log-path "
                f"{run.log}; stop it (kill {exc.owner_pid}: it cleans up) or use another --log-path"
            ) from exc
        except procs.LockBusy as exc:
            release(run)
            print(exc.message, file=sys.stderr, flush=True)
            raise Die(
                1,
                f"could not claim the {role} phase of rank {run.rank} on --log-path {run.log} (lock busy); "
                "retry when it is free",
            ) from exc
        run.claimed.append(role)
    run.groups.take_over_legacy()
    for name in run.group_names:
        if name != "vllm":
            run.groups.stop_stale(name)


def release(run: Run) -> None:
    for role in run.claimed:
        procs.release(run.run_dir, role)
    run.claimed = []


def install_signals(run: Run) -> None:
    """SIGINT / SIGTERM end the run (130 / 143) wherever it waits; SIGUSR1 (the master's heartbeat evicted
    a rank) stops a training that rank was part of, at the next tick."""

    fired: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        # once only: a second signal (a second Ctrl+C, the heartbeat's SIGTERM) must not cut the clean-up short
        if not fired:
            fired.append(signum)
            raise Ended(128 + signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    evicted: list[bool] = []
    signal.signal(signal.SIGUSR1, lambda _s, _f: evicted.append(True))

    def on_evicted() -> None:
        if evicted:
            evicted.clear()
            from coordinator.driver.update import on_evicted as stop_training

            stop_training(run)

    run.supervisor.add(on_evicted)


def dashboard_start(run: Run) -> None:
    """With --dashboard-port, serve the web page for the whole run (the clean-up stops it); a port it cannot
    bind is a warning in its log, never the run's end."""
    if not run.dashboard_name:
        return
    logfile = run.layout.logs_dir(run.rank) / f"{run.dashboard_name}.log"
    run.groups.start(run.dashboard_name, dashboard_cmd(run), logfile, env=run.env())
    port = run.args.dashboard_port
    log(
        f"dashboard: http://127.0.0.1:{port}/ (log: {logfile}; from another host: ssh -L {port}:127.0.0.1:{port} "
        f"{os.uname().nodename})"
    )


def cleanup(run: Run, code: int) -> int:
    """Stop the groups of this run's roles (an update run never stops a rollout run's vLLM), give up the roles;
    on several nodes flag this node's failure first, so that the others stop now. Runs to the end: a second
    Ctrl+C or SIGTERM (or a heartbeat that stops this node) must not cut it short."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from coordinator.driver.update import stop_update

    try:
        code = run.node.leave(code, iteration=run.iteration, phase=run.phase, last_error=run.last_error)
    except Exception:  # telling the others failed: still stop this node's children
        traceback.print_exc()
        code = code or 1
    steps = []
    # only a run that holds all its roles owns their groups (a signal between two claims holds part of them)
    if run.claimed and set(run.claimed) == set(run.roles):
        steps += [lambda: stop_update(run)] if "update" in run.group_names else []
        steps += [run.trainer.stop] if run.trainer is not None else []
        steps += [lambda name=name: run.groups.stop(name, 10) for name in run.group_names]
    for step in [*steps, run.node.stop_heartbeat, lambda: release(run)]:
        try:
            step()
        except Exception:  # one step's failure must not leave the others undone
            traceback.print_exc()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
