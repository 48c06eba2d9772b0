"""Entry point of run.sh's helpers (see the package docstring for the subcommands).

Exit codes: 0 done, 2 bad input (the problems on stderr, nothing written; a model
folder whose config.json cannot size the KV cache is bad input too),
1 anything else (a server that does not answer, a missing file).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rollout_engine.defaults import PROGRESS_S
from rollout_engine.errors import ConfigError
from rollout_engine.exits import Exit
from rollout_engine.layout import Layout

log = logging.getLogger(__name__)


def cmd_compose(args: argparse.Namespace) -> int:
    """Validate the overrides by composing every config; print the routing; save the resolved configs."""
    from coordinator.overrides import Request, route_and_compose

    req = Request(
        args.data_path,
        args.log_path,
        args.base_model,
        list(args.overrides),
        args.debug_mode,
        rank=args.rank,
        rank_weights=args.rank_weights,
        num_nodes=args.num_nodes,
    )
    try:
        routed = route_and_compose(req)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"[baton] error: {problem}", file=sys.stderr)
        return Exit.BAD_INPUT
    if args.save:
        from omegaconf import OmegaConf

        from rollout_engine.files import save_text

        save_text(args.save, OmegaConf.to_yaml(OmegaConf.create(routed.resolved)))
    for target in ("rollout", "update"):
        for override in getattr(routed, target):
            print(f"{target}\t{override}")
    print(f"policy\t{routed.policy_base_url}\t{routed.policy_model}")
    print(f"sessions\t{routed.max_sessions}")
    print("tracker\t" + ",".join(k for k, v in routed.resolved["update"]["tracker"].items() if v))
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    """Append the iteration's record; print it as one line for people (--json: as JSON)."""
    from coordinator.summary import summarize, summary_line

    served = None if args.served_version in (None, "", "base") else int(args.served_version)
    record = summarize(Path(args.log_path), args.iteration, served)
    print(json.dumps(record) if args.json else summary_line(record))
    return 0


def cmd_keep_best(args: argparse.Namespace) -> int:
    """--keep-best after iteration N's held-out rollout: print the decision, one value a line (an empty line
    for an unknown one): action, served, best, source (the folder to copy for a revert), served_rate,
    best_rate, message; keep policy/best on the best policy's folder."""
    from coordinator.keep_best import decide_and_mark

    found = decide_and_mark(Path(args.log_path), args.iteration, args.margin, args.base_model)
    print("\n".join(found.lines()))
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    from coordinator.watch import run_watch

    return run_watch(Path(args.log_path), args.phase, args.iteration, args.every, rank=args.rank)


def cmd_aggregate(args: argparse.Namespace) -> int:
    from coordinator.aggregate import aggregate

    plan = Path(args.takeover_plan) if args.takeover_plan else None
    ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else None
    record = aggregate(Path(args.log_path), args.split, args.iteration, args.num_nodes, args.wall_s, plan, ranks)
    print(f"{record['episodes']}\t{record['planned']}\t{record['success_rate']}\t{int(record['complete'])}")
    return 0


def cmd_takeover_plan(args: argparse.Namespace) -> int:
    """Cut the dead ranks' journals, re-assign their unfinished episodes, write takeover.json (--on-rank-failure
    continue; the driver calls reassign in-process). Prints the plan's path, then
    `dead<TAB>cut lines<TAB>survivor:count,...` per dead rank."""
    from omegaconf import OmegaConf

    from coordinator.reassign import plan_takeover
    from rollout_engine.config import validate

    if not Path(args.config).is_file():
        raise ConfigError(f"--config does not exist (got {args.config!r}); pass a rank's rank_<r>.config.yaml")
    cfg = validate(OmegaConf.load(args.config))
    plan = plan_takeover(cfg, args.dead, [int(r) for r in args.survivors.split(",") if r.strip()])
    print(Layout(cfg.log_path).takeover_plan(cfg.split, cfg.iteration))
    for dead, entry in sorted(plan.dead.items()):
        shares = ",".join(f"{s}:{len(ids)}" for s, ids in sorted(entry.assignments.items()))
        print(f"{dead}\t{entry.cut.lines}\t{shares}")
    return 0


def cmd_node_env(args: argparse.Namespace) -> int:
    from coordinator.nodefile import export_lines, load_node_file, node_env

    print(export_lines(node_env(load_node_file(Path(args.node_file), args.num_nodes), args.rank)), end="")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from coordinator.plot import save_plot

    print(save_plot(Path(args.log_path)))
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from coordinator.plot import format_table

    print(format_table(Path(args.log_path)))
    return 0


def cmd_fingerprint(args: argparse.Namespace) -> int:
    """Print the greedy tokens and logprobs of a fixed prompt (they change when the weights do)."""
    from coordinator.serving import fingerprint

    try:
        print(fingerprint(args.base_url, args.model, args.timeout))
    except OSError as exc:
        print(f"[baton] error: no fingerprint from {args.base_url}: {exc}", file=sys.stderr)
        return Exit.FAILED
    return 0


def cmd_reloadable(args: argparse.Namespace) -> int:
    """Exit 0 when vLLM can reload args.model in place exactly; 1, saying why, when its config ties the
    output head to the embeddings and no file holds the head (rollout_engine/checkpoint.py)."""
    from coordinator.serving import reload_blocker

    why = reload_blocker(Path(args.model))
    if why is None:
        return 0
    print(why, file=sys.stderr)
    return Exit.FAILED


def cmd_serving(args: argparse.Namespace) -> int:
    """Print `dtype<TAB>kv_cache_gib<TAB>reason` for a server of args.model; save it to --record."""
    import os

    from coordinator.serving import serving_plan
    from rollout_engine.files import save_json

    try:
        plan = serving_plan(
            args.device,
            Path(args.model),
            args.sessions,
            args.max_model_len,
            Path(args.cpuinfo),
            os.environ.get("BATON_VLLM_DTYPE", ""),
        )
    except ValueError as exc:
        print(f"[baton] error: {exc}", file=sys.stderr)
        return Exit.BAD_INPUT
    if args.record:
        save_json(args.record, plan.record())
    print(f"{plan.precision.dtype}\t{plan.kv_cache_gib}\t{plan.precision.reason}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m coordinator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    compose = sub.add_parser("compose")
    compose.add_argument("--data-path", required=True)
    compose.add_argument("--log-path", required=True)
    compose.add_argument("--base-model", required=True)
    compose.add_argument("--debug-mode", action="store_true")
    compose.add_argument("--save", default="")
    compose.add_argument("--rank", type=int, default=0)
    compose.add_argument("--rank-weights", default="[1]", help="a Hydra list, e.g. [2,1]")
    compose.add_argument("--num-nodes", type=int, default=1)
    compose.add_argument("overrides", nargs="*")
    compose.set_defaults(func=cmd_compose)
    summarize = sub.add_parser("summarize")
    summarize.add_argument("--log-path", required=True)
    summarize.add_argument("--iteration", type=int, required=True)
    summarize.add_argument("--served-version", default=None)
    summarize.add_argument("--json", action="store_true", help="print the record as JSON, not as a line")
    summarize.set_defaults(func=cmd_summarize)
    keep_best = sub.add_parser("keep-best", help="--keep-best: serve the best policy again after a worse one?")
    keep_best.add_argument("--log-path", required=True)
    keep_best.add_argument("--iteration", type=int, required=True)
    keep_best.add_argument("--margin", type=float, default=0.0, help="points a policy may fall below the best")
    keep_best.add_argument("--base-model", required=True, help="the base model's folder (version 0)")
    keep_best.set_defaults(func=cmd_keep_best)
    watch = sub.add_parser("watch", help="run.sh's live view of one phase (every rank), until SIGTERM")
    watch.add_argument("--log-path", required=True)
    watch.add_argument("--phase", choices=("rollout-train", "rollout-test", "update"), required=True)
    watch.add_argument("--iteration", type=int, required=True)
    watch.add_argument(
        "--every", type=float, default=PROGRESS_S.default, help="seconds between lines when not on a terminal"
    )
    watch.add_argument(
        "--rank",
        type=int,
        help="several nodes: this node's rank (the master's view reads every rank and writes their totals, "
        "a worker's reads its own rank and those totals)",
    )
    watch.set_defaults(func=cmd_watch)
    merge = sub.add_parser("aggregate", help="master: merge every rank's rollout of one iteration")
    merge.add_argument("--log-path", required=True)
    merge.add_argument("--split", choices=("train", "test"), required=True)
    merge.add_argument("--iteration", type=int, required=True)
    merge.add_argument("--num-nodes", type=int, required=True)
    merge.add_argument("--wall-s", type=float, required=True)
    merge.add_argument("--takeover-plan", default="", help="the iteration's takeover.json, if ranks were taken over")
    merge.add_argument("--ranks", default="", help="the ranks with a share in the step, e.g. 0,2 (default: all)")
    merge.set_defaults(func=cmd_aggregate)
    takeover = sub.add_parser("takeover-plan", help="master: re-assign dead ranks' unfinished episodes")
    takeover.add_argument("--config", required=True, help="a rank's resolved rank_<r>.config.yaml of the iteration")
    takeover.add_argument("--dead", type=int, action="append", required=True, help="a dead rank (repeat for several)")
    takeover.add_argument("--survivors", required=True, help="the ranks that take over, e.g. 0,2")
    takeover.set_defaults(func=cmd_takeover_plan)
    node_file = sub.add_parser("node-env", help="this node's settings from a node file, as export lines")
    node_file.add_argument("--node-file", required=True)
    node_file.add_argument("--rank", type=int, required=True)
    node_file.add_argument("--num-nodes", type=int, required=True)
    node_file.set_defaults(func=cmd_node_env)
    for name, func in (("plot", cmd_plot), ("table", cmd_table)):
        command = sub.add_parser(name)
        command.add_argument("--log-path", required=True)
        command.set_defaults(func=func)
    serving = sub.add_parser("serving")
    serving.add_argument("--device", choices=("cpu", "cuda"), required=True)
    serving.add_argument("--model", required=True)
    serving.add_argument("--sessions", type=int, default=32)
    serving.add_argument("--max-model-len", type=int, default=2048)
    serving.add_argument("--cpuinfo", default="/proc/cpuinfo")
    serving.add_argument("--record", default="")
    serving.set_defaults(func=cmd_serving)
    reloadable = sub.add_parser("reloadable", help="exit 0 when vLLM reloads this model folder in place exactly")
    reloadable.add_argument("--model", required=True)
    reloadable.set_defaults(func=cmd_reloadable)
    fingerprint = sub.add_parser("fingerprint")
    fingerprint.add_argument("--base-url", required=True)
    fingerprint.add_argument("--model", required=True)
    fingerprint.add_argument("--timeout", type=float, default=60.0)
    fingerprint.set_defaults(func=cmd_fingerprint)
    from coordinator.dashboard.server import add_subcommand as add_dashboard
    from coordinator.protocol_cli import add_subcommands
    from coordinator.track_cli import add_track

    add_subcommands(sub)
    add_track(sub)
    add_dashboard(sub)
    return parser


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="[baton] %(levelname)s %(name)s: %(message)s")
    from coordinator.protocol_cli import dispatch

    sys.exit(dispatch(build_parser().parse_args()))


if __name__ == "__main__":
    main()
