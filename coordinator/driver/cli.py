"""run.sh's command line: the usage text, the parser and every rule of the argument table (docs/cli.md).

    args = parse(sys.argv[1:])    # the flags as given (unknown, repeated or valueless flags: say.BadInput)
    validate(args)                # every rule; the numbers, the node count, this node's rank and its source
    apply_node_file(args)         # this rank's --node-file settings: os.environ, and args.node_vllm
    slurm_default_addr(args)      # rank 0 of a Slurm step: the first host of SLURM_JOB_NODELIST

Bad input raises `say.BadInput` (exit 2) before anything is started or written. Every message is
run.sh's, byte for byte (tests/shell/run_cli.bats, bad_input_corpus.bats and slurm.bats pin them through
run.sh; tests/unit/driver/test_cli.py here).

`parse` keeps each valued flag's text as given in `Args.given`; `validate` reads the texts there (a flag
absent from it is read from its field, a field at its default being a flag not given) and fills the
typed fields.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from coordinator.driver import say
from coordinator.nodefile import load_node_file, node_env, node_vllm
from rollout_engine import defaults
from rollout_engine.config import REMOVED_VARIABLES, removed_variable_problem
from rollout_engine.errors import ConfigError

USAGE = """\
usage: bash scripts/run.sh --data-path DIR --log-path DIR --rl-phase rollout|update|both [options] [overrides...]

  --data-path DIR            shared data (absolute, must exist): models/, tasks/
  --log-path DIR             this experiment's logs (absolute; created if missing)
  --rl-phase PHASE           rollout | update | both
  --eval-interval N          required with both: evaluate when iteration % N == 1 (N = 1: every iteration)
  --rollout-split SPLIT      required with rollout: train-only | eval-only
  --num-nodes N              nodes sharing the log path (default 1; under srun, SLURM_NTASKS)
  --rank-weights W0,W1,...   required when N > 1: one integer load weight >= 1 per node
  --master | --worker R      this node's rank (0 | 1..N-1); else $RANK, then $NODE_RANK, then under srun $SLURM_PROCID
  --node-addr ADDR           the address other nodes reach this one at (default $BATON_NODE_ADDR, else the default route's)
  --node-file FILE           per-node settings (environment variables, interpreters, vLLM port) by rank (default $BATON_NODE_FILE)
  --on-rank-failure MODE     the master's choice when a worker dies: abort (default: every node stops) | continue
                             (the master finishes the iteration without it; a restarted worker joins the next)
  --debug-mode               use the external vLLM at policy_config.base_url; start/stop nothing
  --resume                   continue the interrupted iteration (on several nodes the master's decides for all)
  --max-iterations N         stop after N iterations (default: run until stopped)
  --max-update-failures N    stop after N consecutive failed updates (default 3)
  --final-eval               both, with --max-iterations: evaluate the last promoted policy on the held-out tasks at the end
  --keep-best                both: after a held-out evaluation, serve the best policy so far again when the
                             evaluated one is worse (promoted as a new version; docs/cli.md)
  --keep-best-margin P       with --keep-best: points of held-out success a policy may fall below the best (default 0)
  --wait-timeout S           update: stop after S seconds with no new train rollout (default: wait until stopped)
  --dashboard-port P         serve the run's web page on 127.0.0.1:P while it runs (docs/observability.md)
  --dry-run                  print the commands each phase would run, then exit
  --stop                     with --log-path only: stop the run on that log path (every node), at once and cleanly
  --check-shared-fs          with --log-path, --num-nodes N and this node's rank, on every node at once: measure what
                             the shared filesystem shows one node of another's writes (docs/multinode.md)
  -h, --help                 this text

overrides: key=value, +key=value, ~key (Hydra); they reach the rollout and the update
(each goes to the configs that have that key). Reference: docs/cli.md
  your own model        model_config.model=FOLDER or a Hub id ORG/NAME (in <data>/.cache/huggingface/hub,
                        else downloaded there); its training template is found from it (docs/models.md)
  vLLM's settings       vllm_config.max_model_len=N, vllm_config.tensor_parallel_size=N, ... (docs/serving.md)
  your own environment  env=custom env._target_=PKG.MODULE.CLASS env_config.python_path=[DIR]
                        (docs/environments.md)"""  # noqa: E501
#: the flags that take a value, and the field of `Args` each fills
VALUED = {
    "--data-path": "data",
    "--log-path": "log",
    "--rl-phase": "phase",
    "--eval-interval": "eval_interval",
    "--rollout-split": "split",
    "--num-nodes": "num_nodes",
    "--rank-weights": "rank_weights",
    "--worker": "worker",
    "--max-iterations": "max_iterations",
    "--max-update-failures": "max_failures",
    "--wait-timeout": "wait_timeout",
    "--node-addr": "node_addr",
    "--node-file": "node_file",
    "--on-rank-failure": "on_failure",
    "--dashboard-port": "dashboard_port",
    "--keep-best-margin": "keep_best_margin",
}
#: the flags without a value, and the field of `Args` each sets
SWITCHES = {
    "--master": "master",
    "--debug-mode": "debug",
    "--resume": "resume",
    "--final-eval": "final_eval",
    "--keep-best": "keep_best",
    "--stop": "stop",
    "--check-shared-fs": "check_shared_fs",
    "--dry-run": "dry_run",
    "-h": "help",
    "--help": "help",
}
#: the fields `parse` fills with the text as given (`validate` only checks them, and trims the paths)
TEXTS = {"data", "log", "phase", "split", "rank_weights", "worker", "node_addr", "node_file"}
PHASES = ("rollout", "update", "both")
SPLITS = ("train-only", "eval-only")
ON_FAILURE = ("abort", "continue")
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: a host name or an IP address (--node-addr, BATON_NODE_ADDR, a Slurm host)
ADDR = re.compile(r"[A-Za-z0-9.:_-]+")
UNSIGNED = defaults.WHOLE
MARGIN = defaults.DECIMAL
SLURM_ADDR_SOURCE = "the first host of SLURM_JOB_NODELIST"


@dataclass
class Args:
    """run.sh's command line: as `parse` found it, then as `validate` filled it in."""

    data: str = ""
    log: str = ""
    phase: str = ""
    eval_interval: int = 0
    split: str = ""
    num_nodes: int = 1
    rank_weights: str = ""  # as given, e.g. "2,1" ("" on one node without the flag)
    rank: int = 0
    rank_source: str = ""  # "--master" "--worker" "RANK" "NODE_RANK" "SLURM_PROCID" or ""
    node_addr: str = ""
    node_addr_source: str = ""
    node_file: str = ""
    on_failure: str = "abort"
    debug: bool = False
    resume: bool = False
    max_iterations: int | None = None
    max_failures: int = 3
    final_eval: bool = False
    keep_best: bool = False
    keep_best_margin: str = "0"  # the text given, e.g. "2.5"
    wait_timeout: int | None = None
    dashboard_port: int | None = None
    dry_run: bool = False
    stop: bool = False
    check_shared_fs: bool = False
    help: bool = False
    overrides: list[str] = field(default_factory=list)
    master: bool = False
    worker: str = ""  # --worker's text as given ("" without it); `rank` holds the rank
    #: each valued flag's text as given on the command line (what `validate` reads)
    given: dict[str, str] = field(default_factory=dict)
    #: this rank's vllm_config from the node file (apply_node_file): composed over the overrides
    node_vllm: dict[str, object] = field(default_factory=dict)

    @property
    def weights(self) -> list[int]:
        """The ranks' load weights: [1] on one node without --rank-weights."""
        return [int(w) for w in bash_fields(self.rank_weights)] if self.rank_weights else [1]


_DEFAULTS = {f.name: f.default for f in fields(Args) if f.default is not MISSING}


def usage() -> str:
    """run.sh's usage text (`print(usage())` writes run.sh --help's bytes)."""
    return USAGE


def parse(argv: list[str]) -> Args:
    """The command line as given: flags, switches and overrides; raises say.BadInput for an unknown
    argument, a flag without its value or a flag given twice. Nothing is checked beyond that."""
    args = Args()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in VALUED:
            if i + 1 >= len(argv):
                raise say.BadInput(f"{arg} needs a value")
            _set_once(args, arg, argv[i + 1])
            i += 2
            continue
        if arg in SWITCHES:
            setattr(args, SWITCHES[arg], True)
        elif arg.startswith(("+", "~")) or "=" in arg:
            if arg.startswith("-"):
                raise say.BadInput(f"unknown option '{arg}'")
            args.overrides.append(arg)
        else:
            raise say.BadInput(
                f"unknown argument '{arg}' (flags start with --; overrides look like key=value, +key=value or ~key)"
            )
        i += 1
    return args


def _set_once(args: Args, flag: str, value: str) -> None:
    """Record a valued flag; a second non-empty one is an error (an empty first value may be replaced, as in Bash)."""
    before = args.given.get(flag, "")
    if before:
        raise say.BadInput(f"{flag} is given twice ('{before}' and '{value}'); give it once")
    args.given[flag] = value
    if VALUED[flag] in TEXTS:
        setattr(args, VALUED[flag], value)


def _raw(args: Args, flag: str) -> str:
    """A valued flag's text, "" when not given: from `args.given`, else from its field (at its default: "")."""
    if flag in args.given:
        return args.given[flag]
    name = VALUED[flag]
    value = getattr(args, name)
    return "" if value is None or value == _DEFAULTS[name] else str(value)


def is_int(text: str, low: int) -> bool:
    """`text` is a whole number in decimal digits, at least `low` (leading zeros are decimal)."""
    return bool(UNSIGNED.fullmatch(text)) and int(text) >= low


def bash_fields(text: str) -> list[str]:
    """`text` split at commas as `IFS=, read -r -a` does: its first line, one trailing empty field dropped."""
    line = text.split("\n", 1)[0]
    if not line:
        return []
    parts = line.split(",")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    return parts


def validate(args: Args, env: Mapping[str, str] = os.environ) -> None:
    """Check every rule of the argument table, in run.sh's order, and fill the typed fields, the node count,
    this node's rank and its source; raises say.BadInput (exit 2) on the first broken rule. Reads and writes
    no file: the log path is only looked at."""
    _validate_paths(args, env)
    _validate_phase(args)
    _validate_nodes(args, env)
    iterations = _raw(args, "--max-iterations")
    if iterations and not is_int(iterations, 1):
        raise say.BadInput(
            f"--max-iterations must be an integer >= 1 (got '{iterations}'); omit it to run until stopped"
        )
    args.max_iterations = int(iterations) if iterations else None
    if args.final_eval and (args.phase != "both" or not iterations):
        raise say.BadInput(
            "--final-eval needs --rl-phase both and --max-iterations N (it evaluates the policy of the last iteration)"
        )
    args.on_failure = _raw(args, "--on-rank-failure") or "abort"
    if args.on_failure not in ON_FAILURE:
        raise say.BadInput(f"--on-rank-failure must be abort or continue (got '{args.on_failure}')")
    failures = _raw(args, "--max-update-failures") or "3"
    if not is_int(failures, 1):
        raise say.BadInput(f"--max-update-failures must be an integer >= 1 (got '{failures}')")
    args.max_failures = int(failures)
    dtype = env.get("BATON_VLLM_DTYPE", "")
    if (dtype or "auto") not in DTYPES:
        raise say.BadInput(
            f"BATON_VLLM_DTYPE must be auto, float32, bfloat16 or float16 (got '{dtype}'); unset it to detect"
        )
    port = _raw(args, "--dashboard-port")
    if port and not (is_int(port, 1) and int(port) <= 65535):
        raise say.BadInput(
            f"--dashboard-port must be a TCP port in 1..65535 (got '{port}'); e.g. --dashboard-port 8080, or drop it"
        )
    args.dashboard_port = int(port) if port else None
    _validate_keep_best(args)
    validate_env(env)
    args.node_addr = _raw(args, "--node-addr") or env.get("BATON_NODE_ADDR", "")
    if args.node_addr and not ADDR.fullmatch(args.node_addr):
        raise say.BadInput(f"--node-addr must be a host name or an IP address (got '{args.node_addr}')")


def _pwd(env: Mapping[str, str]) -> str:
    """The working directory as the shell names it: $PWD when it is this directory (a path through a link
    stays one), else the physical path."""
    pwd = env.get("PWD", "")
    try:
        if pwd.startswith("/") and os.path.samefile(pwd, "."):
            return pwd
    except OSError:
        pass
    return os.getcwd()


def _validate_paths(args: Args, env: Mapping[str, str]) -> None:
    """--data-path and --log-path are given, absolute, usable; each loses one trailing slash."""
    data, log = _raw(args, "--data-path"), _raw(args, "--log-path")
    if not data:
        raise say.BadInput("--data-path is required (the shared data directory, e.g. --data-path /data/shared)")
    if not log:
        raise say.BadInput("--log-path is required (this experiment's directory, e.g. --log-path /data/exp1)")
    if not data.startswith("/"):
        raise say.BadInput(f"--data-path must be an absolute path (got '{data}'); use {_pwd(env)}/{data}")
    if not log.startswith("/"):
        raise say.BadInput(f"--log-path must be an absolute path (got '{log}'); use {_pwd(env)}/{log}")
    args.data = data if data == "/" else data.removesuffix("/")
    args.log = log if log == "/" else log.removesuffix("/")
    for flag, path in (("--data-path", args.data), ("--log-path", args.log)):
        _validate_path_text(flag, path)
    if not os.path.isdir(args.data):
        raise say.BadInput(
            f"--data-path {args.data} is not a directory; run: bash scripts/prepare.sh --data-path {args.data}"
        )
    if os.path.exists(args.log) and not os.path.isdir(args.log):
        raise say.BadInput(f"--log-path {args.log} exists and is not a directory; choose another path")
    if args.log == args.data:
        raise say.BadInput(f"--log-path must differ from --data-path (both are {args.log})")
    _validate_log_parent(args.log)


#: the kernel's limits on a path and on one name in it (Linux: PATH_MAX counts the NUL, NAME_MAX bytes)
PATH_MAX, NAME_MAX = 4095, 255


def _validate_path_text(flag: str, path: str) -> None:
    """No control character (flag files, logs and commands name the path on one line), and a length the
    kernel takes: a longer one fails only later, at the first file made under it."""
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise say.BadInput(f"{flag} must not hold a control character (got {path!r}); choose a path without one")
    for name in path.split("/"):
        if len(name.encode()) > NAME_MAX:
            raise say.BadInput(
                f"{flag} has a name of {len(name.encode())} bytes ('{name}'); a file system takes at most "
                f"{NAME_MAX}: choose a shorter one"
            )
    if len(path.encode()) > PATH_MAX:
        raise say.BadInput(
            f"{flag} is {len(path.encode())} bytes long; the kernel takes paths of at most {PATH_MAX}: "
            "choose a shorter one"
        )


def _validate_log_parent(log: str) -> None:
    """The log path is a directory this node can write, or can be made in its nearest existing ancestor
    (looked at only: nothing is created before the run starts)."""
    ancestor = log
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if ancestor != log and not os.path.isdir(ancestor):
        raise say.BadInput(f"--log-path {log} cannot be created: {ancestor} is not a directory; choose another path")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        what = "is not writable" if ancestor == log else f"cannot be created: {ancestor} is not writable"
        raise say.BadInput(f"--log-path {log} {what} by this user; choose another path or fix its permissions")


def _validate_phase(args: Args) -> None:
    """--rl-phase, and the flags that belong to one phase: --eval-interval, --rollout-split, --wait-timeout."""
    phase = args.phase = _raw(args, "--rl-phase")
    if not phase:
        raise say.BadInput("--rl-phase is required: rollout, update or both")
    if phase not in PHASES:
        raise say.BadInput(f"--rl-phase must be rollout, update or both (got '{phase}')")
    interval = _raw(args, "--eval-interval")
    if phase == "both":
        if not interval:
            raise say.BadInput(
                "--rl-phase both requires --eval-interval N (evaluate when iteration % N == 1; N = 1: every iteration)"
            )
        if not is_int(interval, 1):
            raise say.BadInput(f"--eval-interval must be an integer >= 1 (got '{interval}')")
    elif interval:
        raise say.BadInput(f"--eval-interval applies to --rl-phase both only (got --rl-phase {phase}); drop it")
    args.eval_interval = int(interval) if interval else 0
    split = args.split = _raw(args, "--rollout-split")
    if phase == "rollout":
        if not split:
            raise say.BadInput("--rl-phase rollout requires --rollout-split train-only or eval-only")
        if split not in SPLITS:
            raise say.BadInput(f"--rollout-split must be train-only or eval-only (got '{split}')")
    elif split:
        raise say.BadInput(f"--rollout-split applies to --rl-phase rollout only (got --rl-phase {phase}); drop it")
    wait = _raw(args, "--wait-timeout")
    if wait:
        if phase != "update":
            raise say.BadInput(f"--wait-timeout applies to --rl-phase update only (got --rl-phase {phase}); drop it")
        if not is_int(wait, 0):
            raise say.BadInput(
                f"--wait-timeout must be a number of seconds >= 0 (got '{wait}'); "
                "0 stops at once when there is nothing new"
            )
    args.wait_timeout = int(wait) if wait else None


def _validate_nodes(args: Args, env: Mapping[str, str]) -> None:
    """--num-nodes, --rank-weights and this node's rank: the flags, then RANK / NODE_RANK, then, in a task of
    a Slurm step, SLURM_NTASKS and SLURM_PROCID."""
    nodes = _raw(args, "--num-nodes")
    args.rank_source = ""
    if nodes and not is_int(nodes, 1):
        raise say.BadInput(f"--num-nodes must be an integer >= 1 (got '{nodes}')")
    worker = args.worker = _raw(args, "--worker")
    if args.master and worker:
        raise say.BadInput(
            f"--master and --worker {worker} are exclusive; give --master on node 0, --worker R on the others"
        )
    said = f"--num-nodes {nodes or '1'}"  # the node count as messages name it
    if not (args.master or worker or env.get("RANK") or env.get("NODE_RANK")) and slurm_in_step(env):
        nodes = _validate_slurm(args, nodes, env)
        said = f"--num-nodes {nodes} (from SLURM_NTASKS)"
    nodes = nodes or "1"
    args.num_nodes = int(nodes)
    weights = args.rank_weights = _raw(args, "--rank-weights")
    if args.num_nodes == 1:
        if worker:
            raise say.BadInput(f"--worker {worker} needs --num-nodes > 1 (got 1); drop it for a single node")
        if weights and not UNSIGNED.fullmatch(weights):
            raise say.BadInput(f"--rank-weights needs exactly 1 value with {said} (got '{weights}'); drop it")
        args.rank, args.rank_source = 0, ""
        return
    if not weights:
        ones = ",".join(["1"] * args.num_nodes)
        raise say.BadInput(f'{said} requires --rank-weights with {nodes} values, e.g. "{ones}"')
    values = bash_fields(weights)
    if len(values) != args.num_nodes:
        raise say.BadInput(f"--rank-weights needs exactly {nodes} values for {said} (got '{weights}')")
    for value in values:
        if not is_int(value, 1):
            raise say.BadInput(f"--rank-weights values must be integers >= 1 (got '{value}' in '{weights}')")
    _validate_rank(args, nodes, env)


def _validate_slurm(args: Args, nodes: str, env: Mapping[str, str]) -> str:
    """A task of a Slurm step with no rank from the flags or the environment: each task is one node, so the
    node count is SLURM_NTASKS (--num-nodes, when given, must agree) and the rank SLURM_PROCID. Returns the
    node count's text."""
    tasks = env.get("SLURM_NTASKS", "")
    if not is_int(tasks, 1):
        raise say.BadInput(
            f"SLURM_NTASKS must be an integer >= 1 in a Slurm step (got '{tasks}'); "
            "give the rank with --master / --worker R"
        )
    if not nodes:
        nodes = tasks
    elif int(nodes) != int(tasks):
        raise say.BadInput(
            f"--num-nodes {nodes} does not match this Slurm step's SLURM_NTASKS={tasks} (each task is one node); "
            f"start one task per node (sbatch or srun --nodes={nodes} --ntasks-per-node=1), or give --num-nodes {tasks}"
        )
    if int(nodes) != 1:
        args.rank_source = "SLURM_PROCID"
    return nodes


def _validate_rank(args: Args, nodes: str, env: Mapping[str, str]) -> None:
    """The rank of a multi-node run, in priority order: --master, --worker, RANK, NODE_RANK, SLURM_PROCID."""
    last = args.num_nodes - 1
    if args.master:
        rank, source = "0", "--master"
    elif args.worker:
        if not (is_int(args.worker, 1) and int(args.worker) <= last):
            raise say.BadInput(
                f"--worker must be an integer in 1..{last} for --num-nodes {nodes} (got '{args.worker}'); "
                "node 0 uses --master"
            )
        rank, source = args.worker, "--worker"
    elif env.get("RANK"):
        rank, source = env["RANK"], "RANK"
    elif env.get("NODE_RANK"):
        rank, source = env["NODE_RANK"], "NODE_RANK"
    elif args.rank_source == "SLURM_PROCID":
        rank, source = env.get("SLURM_PROCID", ""), "SLURM_PROCID"
    else:
        raise say.BadInput(
            f"--num-nodes {nodes} needs this node's rank: --master, --worker R, RANK / NODE_RANK in the environment, "
            "or one srun task per node (SLURM_PROCID; docs/slurm.md)"
        )
    args.rank_source = source
    if not (is_int(rank, 0) and int(rank) <= last):
        raise say.BadInput(f"{source} must be an integer in 0..{last} for --num-nodes {nodes} (got '{rank}')")
    args.rank = int(rank)


def _validate_keep_best(args: Args) -> None:
    """--keep-best needs --rl-phase both and a server of ours; its margin is 0..100 points, with it only."""
    margin = _raw(args, "--keep-best-margin")
    if margin:
        if not args.keep_best:
            raise say.BadInput(f"--keep-best-margin {margin} applies with --keep-best only; add --keep-best or drop it")
        if not (MARGIN.fullmatch(margin) and float(margin) <= 100):
            raise say.BadInput(
                f"--keep-best-margin must be a number of percentage points in 0..100 (got '{margin}'); "
                "e.g. --keep-best-margin 2.5"
            )
    args.keep_best_margin = margin or "0"
    if not args.keep_best:
        return
    if args.phase != "both":
        raise say.BadInput(
            f"--keep-best needs --rl-phase both (got --rl-phase {args.phase}): "
            "it acts between an evaluation and the update; drop it"
        )
    if args.debug:
        raise say.BadInput(
            "--keep-best cannot be used with --debug-mode: the external server keeps its weights; drop one of them"
        )


def validate_env(env: Mapping[str, str] = os.environ) -> None:
    """Every variable of the table of defaults that is set (docs/cli.md, Environment) holds a value its Setting
    takes, so that `Setting.value` and `.seconds` read it later without a check; a removed variable
    (VLLM_MAX_MODEL_LEN: vllm_config's now) is not set."""
    for name in REMOVED_VARIABLES:
        if name in env:
            raise say.BadInput(removed_variable_problem(name))
    for setting in defaults.EVERY_SETTING:
        text = env.get(setting.env, "")
        if text and (problem := setting.problem(text)):
            raise say.BadInput(f"{problem}; unset it for the default (docs/cli.md, Environment)")


def apply_node_file(args: Args, env: MutableMapping[str, str] = os.environ) -> None:
    """Export this rank's settings from --node-file (else $BATON_NODE_FILE) into `env`: environment variables,
    interpreters, vLLM port, address (which becomes the node's address when none was given); its vllm_config
    goes to `args.node_vllm`. A bad file ends the run with exit 2, each problem on its own error line, before
    anything starts."""
    path = args.node_file or env.get("BATON_NODE_FILE", "")
    if not path:
        return
    try:
        groups = load_node_file(Path(path), args.num_nodes)
        exports = node_env(groups, args.rank)
    except ConfigError as exc:
        *first, last = exc.problems or [str(exc)]
        for problem in first:
            say.log(f"error: {problem}")
        raise say.Die(2, last) from None
    except (OSError, ValueError) as exc:  # a folder, an unreadable or binary file (Bash: a traceback, then exit 2)
        raise say.Die(
            2, f"--node-file {path} cannot be read ({exc}); give the path of a YAML node file (docs/multinode.md)"
        ) from None
    env.update(exports)
    args.node_vllm = node_vllm(groups, args.rank)
    if env.get("BATON_NODE_ADDR") and not args.node_addr:
        args.node_addr = env["BATON_NODE_ADDR"]
    names = [*exports, *(f"vllm_config.{key}={value}" for key, value in args.node_vllm.items())]
    if names:
        say.log(f"node file {path}: rank {args.rank} sets {' '.join(names)}")


def slurm_in_step(env: Mapping[str, str] = os.environ) -> bool:
    """A task of a Slurm job step (srun), whose SLURM_PROCID and SLURM_NTASKS are the step's. A batch
    script's own shell has SLURM_PROCID=0 and the job's SLURM_NTASKS too, but no step id: it is no task."""
    step = env.get("SLURM_STEP_ID", "")
    return bool(step and env.get("SLURM_PROCID")) and step != "batch"


def slurm_first_host(hostlist: str) -> str:
    """The first host of a Slurm host list ("gpu[003-004,010],cpu1" -> gpu003; "rack[1-2]n[5-6]" -> rack1n5),
    as `scontrol show hostnames` would, without asking Slurm."""
    rest, host = hostlist, ""
    while rest and rest[0] != ",":
        if rest[0] == "[" and "]" in rest:
            inside, rest = rest[1:].split("]", 1)
            host += re.split("[,-]", inside, maxsplit=1)[0]
        else:
            host, rest = host + rest[0], rest[1:]
    return host


def slurm_default_addr(args: Args, env: Mapping[str, str] = os.environ) -> None:
    """On rank 0 of a run whose rank came from Slurm, with no address given (--node-addr, BATON_NODE_ADDR,
    the node file): the first host of SLURM_JOB_NODELIST, when that is this node (task 0's node under srun's
    default block distribution). Workers learn the master's address from the run record."""
    if args.node_addr or args.rank_source != "SLURM_PROCID" or args.rank != 0:
        return
    host = slurm_first_host(env.get("SLURM_JOB_NODELIST", ""))
    if not ADDR.fullmatch(host):
        return
    node = env.get("SLURMD_NODENAME", "")
    if node and host != node:
        say.log(
            f"Slurm: task 0 runs on {node}, not on the first host of SLURM_JOB_NODELIST ({host}); "
            "the master's address is this host's default route's (give --node-addr to choose)"
        )
        return
    args.node_addr, args.node_addr_source = host, SLURM_ADDR_SOURCE


def slurm_describe(args: Args, env: Mapping[str, str] = os.environ) -> str:
    """One line on where this run runs in Slurm ("" outside a step): job, step, task, host; the rank and
    the address when Slurm gave them."""
    if not slurm_in_step(env):
        return ""
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    line = (
        f"Slurm job {env.get('SLURM_JOB_ID') or '?'} step {env['SLURM_STEP_ID']}: "
        f"task {env['SLURM_PROCID']} of {env.get('SLURM_NTASKS') or '?'} on {node}"
    )
    if args.rank_source == "SLURM_PROCID":
        line += f"; rank {args.rank} of {args.num_nodes} from SLURM_PROCID / SLURM_NTASKS"
    if args.node_addr_source:
        line += f"; address {args.node_addr} ({args.node_addr_source})"
    return line
