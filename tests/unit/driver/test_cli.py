"""The driver's command line (coordinator/driver/cli.py, stop.py): every rule of run.sh's argument table.

Each bad command line raises say.BadInput with run.sh's exact message (tests/shell/run_cli.bats and
bad_input_corpus.bats pin the same text through run.sh) and writes nothing: the log path stays absent
and nothing goes to stdout. The environment is passed in, never read from the test's own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from coordinator.driver import say
from coordinator.driver.cli import (
    Args,
    apply_node_file,
    parse,
    slurm_default_addr,
    slurm_describe,
    slurm_first_host,
    slurm_in_step,
    usage,
    validate,
)
from coordinator.driver.stop import stop_run
from coordinator.membership import pid_started
from rollout_engine.defaults import EVERY_SETTING, Setting
from rollout_engine.layout import Layout


@dataclass
class Paths:
    """A data folder that exists and a log path that does not (yet)."""

    data: Path
    log: Path

    def base(self, *rest: str) -> list[str]:
        return ["--data-path", str(self.data), "--log-path", str(self.log), *rest]


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    return Paths(tmp_path / "data", tmp_path / "log")


def checked(argv: list[str], env: dict[str, str] | None = None) -> Args:
    """parse + validate, as run.py does, with only `env` for the environment."""
    args = parse(argv)
    validate(args, env or {})
    return args


def refused(argv: list[str], env: dict[str, str] | None = None) -> str:
    """The message of the BadInput that parse or validate raises for `argv`."""
    with pytest.raises(say.BadInput) as caught:
        checked(argv, env)
    assert caught.value.code == 2
    return caught.value.message


def assert_nothing_written(paths: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    assert not paths.log.exists()
    assert capsys.readouterr().out == ""


# (flags after --data-path D --log-path L, environment, message); {D} and {L} are the two paths
TABLE = [
    (["--rl-phase", "train"], {}, "--rl-phase must be rollout, update or both (got 'train')"),
    ([], {}, "--rl-phase is required: rollout, update or both"),
    (
        ["--rl-phase", "both"],
        {},
        "--rl-phase both requires --eval-interval N (evaluate when iteration % N == 1; N = 1: every iteration)",
    ),
    (["--rl-phase", "both", "--eval-interval", "1.5"], {}, "--eval-interval must be an integer >= 1 (got '1.5')"),
    (
        ["--rl-phase", "update", "--eval-interval", "2"],
        {},
        "--eval-interval applies to --rl-phase both only (got --rl-phase update); drop it",
    ),
    (["--rl-phase", "rollout"], {}, "--rl-phase rollout requires --rollout-split train-only or eval-only"),
    (
        ["--rl-phase", "rollout", "--rollout-split", "train"],
        {},
        "--rollout-split must be train-only or eval-only (got 'train')",
    ),
    (
        ["--rl-phase", "both", "--eval-interval", "1", "--rollout-split", "train-only"],
        {},
        "--rollout-split applies to --rl-phase rollout only (got --rl-phase both); drop it",
    ),
    (
        ["--rl-phase", "both", "--eval-interval", "1", "--wait-timeout", "10"],
        {},
        "--wait-timeout applies to --rl-phase update only (got --rl-phase both); drop it",
    ),
    (
        ["--rl-phase", "update", "--wait-timeout", "-5"],
        {},
        "--wait-timeout must be a number of seconds >= 0 (got '-5'); 0 stops at once when there is nothing new",
    ),
    (["--rl-phase", "update", "--num-nodes", "x"], {}, "--num-nodes must be an integer >= 1 (got 'x')"),
    (
        ["--rl-phase", "update", "--num-nodes", "2", "--master"],
        {},
        '--num-nodes 2 requires --rank-weights with 2 values, e.g. "1,1"',
    ),
    (
        ["--rl-phase", "update", "--num-nodes", "2", "--rank-weights", "1,1,1", "--master"],
        {},
        "--rank-weights needs exactly 2 values for --num-nodes 2 (got '1,1,1')",
    ),
    (
        ["--rl-phase", "update", "--num-nodes", "2", "--rank-weights", "a,b", "--master"],
        {},
        "--rank-weights values must be integers >= 1 (got 'a' in 'a,b')",
    ),
    (
        ["--rl-phase", "update", "--rank-weights", "1,1"],
        {},
        "--rank-weights needs exactly 1 value with --num-nodes 1 (got '1,1'); drop it",
    ),
    (
        ["--rl-phase", "update", "--num-nodes", "2", "--rank-weights", "1,1", "--master", "--worker", "1"],
        {},
        "--master and --worker 1 are exclusive; give --master on node 0, --worker R on the others",
    ),
    (
        ["--rl-phase", "update", "--num-nodes", "2", "--rank-weights", "1,1", "--worker", "x"],
        {},
        "--worker must be an integer in 1..1 for --num-nodes 2 (got 'x'); node 0 uses --master",
    ),
    (
        ["--rl-phase", "update", "--worker", "1"],
        {},
        "--worker 1 needs --num-nodes > 1 (got 1); drop it for a single node",
    ),
    (
        ["--rl-phase", "update", "--num-nodes", "2", "--rank-weights", "1,1"],
        {},
        "--num-nodes 2 needs this node's rank: --master, --worker R, RANK / NODE_RANK in the environment, "
        "or one srun task per node (SLURM_PROCID; docs/slurm.md)",
    ),
    (
        ["--rl-phase", "update", "--num-nodes", "2", "--rank-weights", "1,1"],
        {"RANK": "5"},
        "RANK must be an integer in 0..1 for --num-nodes 2 (got '5')",
    ),
    (
        ["--rl-phase", "update", "--num-nodes", "2", "--rank-weights", "1,1"],
        {"NODE_RANK": "x"},
        "NODE_RANK must be an integer in 0..1 for --num-nodes 2 (got 'x')",
    ),
    (
        ["--rl-phase", "update", "--max-iterations", "0"],
        {},
        "--max-iterations must be an integer >= 1 (got '0'); omit it to run until stopped",
    ),
    (
        ["--rl-phase", "both", "--eval-interval", "1", "--final-eval"],
        {},
        "--final-eval needs --rl-phase both and --max-iterations N (it evaluates the policy of the last iteration)",
    ),
    (
        ["--rl-phase", "update", "--on-rank-failure", "retry"],
        {},
        "--on-rank-failure must be abort or continue (got 'retry')",
    ),
    (
        ["--rl-phase", "update", "--max-update-failures", "0"],
        {},
        "--max-update-failures must be an integer >= 1 (got '0')",
    ),
    (
        ["--rl-phase", "update"],
        {"BATON_VLLM_DTYPE": "int8"},
        "BATON_VLLM_DTYPE must be auto, float32, bfloat16 or float16 (got 'int8'); unset it to detect",
    ),
    (
        ["--rl-phase", "update"],
        {"VLLM_MAX_MODEL_LEN": "4096"},
        "VLLM_MAX_MODEL_LEN is no longer read: vLLM's settings are vllm_config's now; unset it and pass "
        "vllm_config.max_model_len=VALUE (or set it in a node group's vllm_config; docs/serving.md)",
    ),
    (
        ["--rl-phase", "update"],
        {"VLLM_GPU_MEMORY_UTILIZATION": ""},
        "VLLM_GPU_MEMORY_UTILIZATION is no longer read: vLLM's settings are vllm_config's now; unset it and pass "
        "vllm_config.gpu_memory_utilization=VALUE (or set it in a node group's vllm_config; docs/serving.md)",
    ),
    (
        ["--rl-phase", "update", "--dashboard-port", "70000"],
        {},
        "--dashboard-port must be a TCP port in 1..65535 (got '70000'); e.g. --dashboard-port 8080, or drop it",
    ),
    (
        ["--rl-phase", "both", "--eval-interval", "1", "--keep-best-margin", "2"],
        {},
        "--keep-best-margin 2 applies with --keep-best only; add --keep-best or drop it",
    ),
    (
        ["--rl-phase", "both", "--eval-interval", "1", "--keep-best", "--keep-best-margin", "150"],
        {},
        "--keep-best-margin must be a number of percentage points in 0..100 (got '150'); e.g. --keep-best-margin 2.5",
    ),
    (
        ["--rl-phase", "update", "--keep-best"],
        {},
        "--keep-best needs --rl-phase both (got --rl-phase update): it acts between an evaluation and the update; "
        "drop it",
    ),
    (
        ["--rl-phase", "both", "--eval-interval", "1", "--keep-best", "--debug-mode"],
        {},
        "--keep-best cannot be used with --debug-mode: the external server keeps its weights; drop one of them",
    ),
    (
        ["--rl-phase", "update"],
        {"BATON_CHECK_TIMEOUT_S": "0"},
        "BATON_CHECK_TIMEOUT_S must be a whole number >= 1 (got '0'); unset it for the default (docs/cli.md, "
        "Environment)",
    ),
    (
        ["--rl-phase", "update"],
        {"BATON_ROLLOUT_STALL_S": "15m"},
        "BATON_ROLLOUT_STALL_S must be a whole number >= 0 (got '15m'); unset it for the default (docs/cli.md, "
        "Environment)",
    ),
    (
        ["--rl-phase", "both", "--eval-interval", "1"],
        {"BATON_VLLM_ENGINE_FORK": "yes"},
        "BATON_VLLM_ENGINE_FORK must be 0 or 1 (got 'yes'); unset it for the default (docs/cli.md, Environment)",
    ),
    (
        ["--rl-phase", "update"],
        {"BATON_START_SPREAD_S": "1m"},
        "BATON_START_SPREAD_S must be a whole number >= 0 (got '1m'); unset it for the default (docs/cli.md, "
        "Environment)",
    ),
    (
        ["--rl-phase", "update"],
        {"BATON_VLLM_PORT": "80OO"},
        "BATON_VLLM_PORT must be a whole number from 1 to 65535 (got '80OO'); unset it for the default (docs/cli.md, "
        "Environment)",
    ),
    (
        ["--rl-phase", "update"],
        {"BATON_VLLM_PORT": "70000"},
        "BATON_VLLM_PORT must be a whole number from 1 to 65535 (got '70000'); unset it for the default (docs/cli.md, "
        "Environment)",
    ),
    (
        ["--rl-phase", "update"],
        {"BATON_WARM_TRAINER": "yes"},
        "BATON_WARM_TRAINER must be 0 or 1 (got 'yes'); unset it for the default (docs/cli.md, Environment)",
    ),
    (
        ["--rl-phase", "update"],
        {"BATON_HEARTBEAT_S": "fast"},
        "BATON_HEARTBEAT_S must be a number of seconds > 0 (got 'fast'); unset it for the default (docs/cli.md, "
        "Environment)",
    ),
    (
        ["--rl-phase", "update", "--node-addr", "a b"],
        {},
        "--node-addr must be a host name or an IP address (got 'a b')",
    ),
    (
        ["--rl-phase", "update"],
        {"BATON_NODE_ADDR": "x;y"},
        "--node-addr must be a host name or an IP address (got 'x;y')",
    ),
]


@pytest.mark.parametrize(("flags", "env", "message"), TABLE, ids=[row[2][:48] for row in TABLE])
def test_each_rule_refuses_with_run_sh_s_message(
    paths: Paths, capsys: pytest.CaptureFixture[str], flags: list[str], env: dict[str, str], message: str
) -> None:
    """One representative case per rule of the argument table: the exact message, exit 2, nothing written."""
    assert refused(paths.base(*flags), env) == message
    assert_nothing_written(paths, capsys)


@pytest.mark.parametrize("setting", EVERY_SETTING, ids=[s.env for s in EVERY_SETTING])
def test_every_setting_of_the_environment_is_checked_before_anything_starts(
    paths: Paths, capsys: pytest.CaptureFixture[str], setting: Setting
) -> None:
    """Each variable of the table of defaults (docs/cli.md, Environment), set to what it cannot read, is bad input
    naming it and the value (the driver reads them later without a check); its default passes."""
    for bad in ("1O", "-1", " 5", "2x"):
        message = refused(paths.base("--rl-phase", "update"), {setting.env: bad})
        assert message.startswith(f"{setting.env} must be ") and f"(got '{bad}')" in message, message
    checked(paths.base("--rl-phase", "update"), {setting.env: f"{setting.default:g}"})
    assert_nothing_written(paths, capsys)


def test_the_paths_are_given_absolute_and_usable(paths: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    """The two paths: required, absolute (the fix names $PWD), the data an existing folder, the log no file."""
    data, log, update = str(paths.data), str(paths.log), ["--rl-phase", "update"]
    assert refused(["--log-path", log, *update]) == (
        "--data-path is required (the shared data directory, e.g. --data-path /data/shared)"
    )
    assert refused(["--data-path", data, *update]) == (
        "--log-path is required (this experiment's directory, e.g. --log-path /data/exp1)"
    )
    cwd = str(paths.data.parent)
    assert refused(["--data-path", "data", "--log-path", log, *update], {"PWD": cwd}) == (
        f"--data-path must be an absolute path (got 'data'); use {cwd}/data"
    )
    assert refused(["--data-path", data, "--log-path", "../exp", *update], {"PWD": cwd}) == (
        f"--log-path must be an absolute path (got '../exp'); use {cwd}/../exp"
    )
    assert refused(["--data-path", f"{cwd}/nope/", "--log-path", log, *update]) == (
        f"--data-path {cwd}/nope is not a directory; run: bash scripts/prepare.sh --data-path {cwd}/nope"
    )
    assert refused(["--data-path", data, "--log-path", f"{data}/", *update]) == (
        f"--log-path must differ from --data-path (both are {data})"
    )
    assert_nothing_written(paths, capsys)
    paths.log.write_text("")
    assert refused(paths.base(*update)) == f"--log-path {log} exists and is not a directory; choose another path"
    assert paths.log.read_text() == ""


def test_the_paths_are_plain_of_a_length_the_kernel_takes_and_the_log_path_can_be_created(
    paths: Paths, capsys: pytest.CaptureFixture[str]
) -> None:
    """No control character (the flag files and logs name the paths on one line), within PATH_MAX and
    NAME_MAX, and a log path that does not exist yet has a directory it can be made in."""
    data, log, update = str(paths.data), str(paths.log), ["--rl-phase", "update"]
    assert refused(["--data-path", data, "--log-path", log + "\nexp2", *update]) == (
        f"--log-path must not hold a control character (got {log + chr(10) + 'exp2'!r}); choose a path without one"
    )
    assert refused(["--data-path", data + "\t", "--log-path", log, *update]) == (
        f"--data-path must not hold a control character (got {data + chr(9)!r}); choose a path without one"
    )
    long = log + "/" + "x" * 300
    assert refused(["--data-path", data, "--log-path", long, *update]) == (
        f"--log-path has a name of 300 bytes ('{'x' * 300}'); a file system takes at most 255: choose a shorter one"
    )
    deep = log + ("/" + "d" * 200) * 21
    assert refused(["--data-path", data, "--log-path", deep, *update]) == (
        f"--log-path is {len(deep)} bytes long; the kernel takes paths of at most 4095: choose a shorter one"
    )
    blocker = paths.data.parent / "a-file"
    blocker.write_text("")
    assert refused(["--data-path", data, "--log-path", f"{blocker}/exp", *update]) == (
        f"--log-path {blocker}/exp cannot be created: {blocker} is not a directory; choose another path"
    )
    assert_nothing_written(paths, capsys)


def test_a_log_path_this_user_cannot_write_is_refused(
    paths: Paths, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Tests run as root, whom permissions do not stop: os.access answers as for a read-only mount.)"""
    parent = str(paths.log.parent)
    monkeypatch.setattr(os, "access", lambda path, mode: path != parent)
    assert refused(paths.base("--rl-phase", "update")) == (
        f"--log-path {paths.log} cannot be created: {parent} is not writable by this user; choose another path or "
        "fix its permissions"
    )
    paths.log.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: path != str(paths.log))
    assert refused(paths.base("--rl-phase", "update")) == (
        f"--log-path {paths.log} is not writable by this user; choose another path or fix its permissions"
    )
    assert list(paths.log.iterdir()) == [] and capsys.readouterr().out == ""


def test_the_parser_refuses_unknown_valueless_and_repeated_flags(paths: Paths) -> None:
    """What the parser alone refuses, before any rule: the order of the words decides which message."""
    unknown = "(flags start with --; overrides look like key=value, +key=value or ~key)"
    assert refused(paths.base("--rl-phase", "update", "foo")) == f"unknown argument 'foo' {unknown}"
    assert refused(paths.base("--rl-phase", "update", "--bogus")) == f"unknown argument '--bogus' {unknown}"
    assert refused(paths.base("--rl-phase", "update", "--bogus=1")) == "unknown option '--bogus=1'"
    assert refused(paths.base("--rl-phase", "both", "--eval-interval")) == "--eval-interval needs a value"
    assert refused(paths.base("--rl-phase", "update", "--rl-phase", "both")) == (
        "--rl-phase is given twice ('update' and 'both'); give it once"
    )
    assert refused(["--node-file", "/a", "--node-file", "/b"]) == (
        "--node-file is given twice ('/a' and '/b'); give it once"
    )
    assert parse(["--rl-phase", "", "--rl-phase", "update"]).phase == "update"  # an empty value may be replaced


def test_a_good_command_line_fills_the_typed_fields(paths: Paths) -> None:
    """Numbers become numbers, defaults are run.sh's, overrides keep their order, one trailing slash goes."""
    flags = ["--rl-phase", "both", "--eval-interval", "2", "--max-iterations", "5", "--final-eval", "--keep-best"]
    flags += ["--keep-best-margin", "2.5", "--dashboard-port", "8080", "x=1", "+y=2", "~z", "--resume", "--dry-run"]
    args = checked(["--data-path", f"{paths.data}/", "--log-path", f"{paths.log}/", *flags])
    assert (args.data, args.log, args.phase, args.eval_interval) == (str(paths.data), str(paths.log), "both", 2)
    assert (args.max_iterations, args.max_failures, args.on_failure, args.wait_timeout) == (5, 3, "abort", None)
    assert (args.keep_best, args.keep_best_margin, args.dashboard_port) == (True, "2.5", 8080)
    assert (args.num_nodes, args.rank, args.rank_source, args.weights, args.rank_weights) == (1, 0, "", [1], "")
    assert (args.overrides, args.resume, args.dry_run, args.final_eval) == (["x=1", "+y=2", "~z"], True, True, True)
    update = checked(paths.base("--rl-phase", "update", "--wait-timeout", "0", "--on-rank-failure", "continue"))
    assert (update.wait_timeout, update.on_failure, update.eval_interval, update.keep_best_margin) == (
        0,
        "continue",
        0,
        "0",
    )


def test_the_rank_comes_from_the_flags_then_rank_then_node_rank(paths: Paths) -> None:
    """--master / --worker first, then RANK, then NODE_RANK; the weights as given, one per node."""
    two = paths.base("--rl-phase", "update", "--num-nodes", "2", "--rank-weights", "2,1")
    master = checked([*two, "--master"], {"RANK": "1"})
    assert (master.rank, master.rank_source, master.num_nodes, master.weights) == (0, "--master", 2, [2, 1])
    assert (checked([*two, "--worker", "1"]).rank, checked([*two, "--worker", "1"]).rank_source) == (1, "--worker")
    assert checked(two, {"RANK": "1", "NODE_RANK": "0"}).rank_source == "RANK"
    assert checked(two, {"NODE_RANK": "1"}).rank == 1


def in_step(procid: str, ntasks: str, **more: str) -> dict[str, str]:
    """The environment srun gives task `procid` of `ntasks` (job 7, step 0, nodes n0 and n1)."""
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": procid, "SLURM_NTASKS": ntasks}
    return env | {"SLURM_JOB_NODELIST": "n[0-1]", "SLURMD_NODENAME": f"n{procid}"} | more


def test_slurm_a_task_of_a_step_is_a_node(paths: Paths) -> None:
    """In a step each task is one node: the count from SLURM_NTASKS, the rank from SLURM_PROCID; a batch
    script's own shell (no step id) is no task; the flags and RANK come first."""
    rollout = paths.base("--rl-phase", "rollout", "--rollout-split", "train-only")
    args = checked([*rollout, "--rank-weights", "2,1"], in_step("1", "2"))
    assert (args.num_nodes, args.rank, args.rank_source, args.weights) == (2, 1, "SLURM_PROCID", [2, 1])
    assert slurm_describe(args, in_step("1", "2")) == (
        "Slurm job 7 step 0: task 1 of 2 on n1; rank 1 of 2 from SLURM_PROCID / SLURM_NTASKS"
    )
    single = checked(rollout, in_step("0", "1"))
    assert (single.num_nodes, single.rank_source) == (1, "")
    assert slurm_describe(single, in_step("0", "1")) == "Slurm job 7 step 0: task 0 of 1 on n0"
    master = checked([*rollout, "--num-nodes", "2", "--rank-weights", "1,1", "--master"], in_step("1", "3"))
    assert (master.rank, master.rank_source, master.num_nodes) == (0, "--master", 2)
    batch = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
    assert not slurm_in_step(batch) and not slurm_in_step(batch | {"SLURM_STEP_ID": "batch"})
    assert slurm_in_step(batch | {"SLURM_STEP_ID": "0"}) and slurm_describe(checked(rollout, batch), batch) == ""


SLURM_BAD = [
    (
        ["--num-nodes", "3", "--rank-weights", "1,1,1"],
        {},
        "--num-nodes 3 does not match this Slurm step's SLURM_NTASKS=2 (each task is one node); start one task per "
        "node (sbatch or srun --nodes=3 --ntasks-per-node=1), or give --num-nodes 2",
    ),
    ([], {}, '--num-nodes 2 (from SLURM_NTASKS) requires --rank-weights with 2 values, e.g. "1,1"'),
    (
        ["--rank-weights", "1,1,1"],
        {},
        "--rank-weights needs exactly 2 values for --num-nodes 2 (from SLURM_NTASKS) (got '1,1,1')",
    ),
    (
        ["--num-nodes", "2", "--rank-weights", "1,1"],
        {"SLURM_NTASKS": "two"},
        "SLURM_NTASKS must be an integer >= 1 in a Slurm step (got 'two'); give the rank with --master / --worker R",
    ),
    (
        ["--rank-weights", "1,1"],
        {"SLURM_PROCID": "x"},
        "SLURM_PROCID must be an integer in 0..1 for --num-nodes 2 (got 'x')",
    ),
]


@pytest.mark.parametrize(("flags", "env", "message"), SLURM_BAD, ids=[row[2][:40] for row in SLURM_BAD])
def test_slurm_a_mismatch_is_bad_input(
    paths: Paths, capsys: pytest.CaptureFixture[str], flags: list[str], env: dict[str, str], message: str
) -> None:
    """Flags that disagree with Slurm's view of the step, or a step's variables that are no numbers."""
    rollout = paths.base("--rl-phase", "rollout", "--rollout-split", "train-only", *flags)
    assert refused(rollout, in_step("1", "2") | env) == message
    assert_nothing_written(paths, capsys)


def test_slurm_rank_0_s_default_address(paths: Paths, capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 0 from Slurm with no address takes the first host of the node list when it runs there; a given
    address wins; a worker, or task 0 on another host, takes none (the latter says so)."""
    update = paths.base("--rl-phase", "update", "--rank-weights", "1,1")
    env = in_step("0", "2")
    args = checked(update, env)
    slurm_default_addr(args, env)
    assert (args.node_addr, args.node_addr_source) == ("n0", "the first host of SLURM_JOB_NODELIST")
    assert slurm_describe(args, env).endswith("; address n0 (the first host of SLURM_JOB_NODELIST)")
    given = checked([*update, "--node-addr", "10.0.0.6"], env)
    slurm_default_addr(given, env)
    assert (given.node_addr, given.node_addr_source) == ("10.0.0.6", "")
    worker = checked(update, in_step("1", "2"))
    slurm_default_addr(worker, in_step("1", "2"))
    assert worker.node_addr == ""
    elsewhere = in_step("0", "2", SLURMD_NODENAME="n1")
    moved = checked(update, elsewhere)
    slurm_default_addr(moved, elsewhere)
    assert moved.node_addr == ""
    assert capsys.readouterr().err == (
        "[baton] Slurm: task 0 runs on n1, not on the first host of SLURM_JOB_NODELIST (n0); "
        "the master's address is this host's default route's (give --node-addr to choose)\n"
    )


def test_slurm_first_host_reads_a_host_list() -> None:
    """The first host of a Slurm host list, ranges and lists included, as scontrol would print it."""
    cases = {"localhost": "localhost", "gpu[003-004,010],cpu1": "gpu003", "gpu[010,003-004]": "gpu010"}
    cases |= {"a1,b[1-2]": "a1", "rack[1-2]n[5-6]": "rack1n5", "": ""}
    assert {hostlist: slurm_first_host(hostlist) for hostlist in cases} == cases


def test_the_node_file_exports_this_rank_s_settings(
    paths: Paths, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--node-file's group of this rank goes into the environment (its address becomes the node's when none
    was given), with one line naming the variables; a rank in no group gets nothing."""
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("node_groups: [{node_ranks: 1, env_vars: {GLOO_SOCKET_IFNAME: eth0}, node_addr: 10.0.0.9}]\n")
    two = paths.base("--rl-phase", "update", "--num-nodes", "2", "--rank-weights", "1,1", "--node-file", str(nodes))
    env: dict[str, str] = {}
    worker = checked([*two, "--worker", "1"], env)
    apply_node_file(worker, env)
    assert env == {"GLOO_SOCKET_IFNAME": "eth0", "BATON_NODE_ADDR": "10.0.0.9"} and worker.node_addr == "10.0.0.9"
    assert capsys.readouterr().err == f"[baton] node file {nodes}: rank 1 sets GLOO_SOCKET_IFNAME BATON_NODE_ADDR\n"
    master, env = checked([*two, "--master"], {}), {"BATON_NODE_FILE": "/elsewhere.yaml"}
    apply_node_file(master, env)
    assert env == {"BATON_NODE_FILE": "/elsewhere.yaml"} and capsys.readouterr().err == ""


def test_the_node_file_s_vllm_config_goes_to_the_composed_config_not_the_environment(
    paths: Paths, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("node_groups: [{node_ranks: 0, vllm_config: {tensor_parallel_size: 2, max_model_len: 4096}}]\n")
    env: dict[str, str] = {}
    args = checked(paths.base("--rl-phase", "rollout", "--rollout-split", "train-only", "--node-file", str(nodes)))
    apply_node_file(args, env)
    assert env == {} and args.node_vllm == {"tensor_parallel_size": 2, "max_model_len": 4096}
    assert capsys.readouterr().err == (
        f"[baton] node file {nodes}: rank 0 sets vllm_config.tensor_parallel_size=2 vllm_config.max_model_len=4096\n"
    )


def test_a_bad_node_file_exits_2_naming_each_problem(
    paths: Paths, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each problem of a bad node file on an error line of its own, exit 2 (no pointer to --help, as in
    run.sh), before anything is written; $BATON_NODE_FILE stands in for the flag."""
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("node_groups: [{node_ranks: 0, vllm_port: 70000, colour: red}]\n")
    env = {"BATON_NODE_FILE": str(nodes)}
    args = checked(paths.base("--rl-phase", "update"), env)
    with pytest.raises(say.Die) as caught:
        apply_node_file(args, env)
    where = f"--node-file {nodes}: node_groups[0]"
    port = f"{where}.vllm_port must be a TCP port 1..65535 (got 70000)"
    assert (caught.value.code, say.error_lines(caught.value)) == (2, [f"[baton] error: {port}"])
    known = "env_vars, label, node_addr, node_ranks, python, vllm_config, vllm_port"
    assert capsys.readouterr().err == f"[baton] error: {where} has unknown keys ['colour']; known: {known}\n"
    assert env == {"BATON_NODE_FILE": str(nodes)}
    with pytest.raises(say.Die) as missing:
        apply_node_file(args, {"BATON_NODE_FILE": str(tmp_path / "none.yaml")})
    assert missing.value.message == (
        f"--node-file {tmp_path}/none.yaml does not exist; give the path of a YAML node file (docs/multinode.md)"
    )
    assert not paths.log.exists()


def test_help_and_usage(paths: Paths) -> None:
    """--help wins over the rules (after the parser); the usage text is run.sh's, printed with print()."""
    args = parse(["--help", "--rl-phase", "nonsense"])
    assert args.help and not args.stop
    assert usage().startswith("usage: bash scripts/run.sh --data-path DIR --log-path DIR --rl-phase rollout|")
    assert "(each goes to the configs that have that key). Reference: docs/cli.md" in usage()
    for flag in ("--eval-interval N", "--max-iterations N", "--dry-run", "--stop", "--keep-best-margin P"):
        assert flag in usage()
    # what a user brings: the settings that name a model, vLLM's settings, an environment of one's own
    for setting in ("model_config.model=FOLDER", "vllm_config.max_model_len=N", "env_config.python_path=[DIR]"):
        assert setting in usage()


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two processes that stand in for run.sh processes."""
    processes = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def test_stop_needs_a_log_path_and_something_to_stop(tmp_path: Path) -> None:
    """--stop: the log path of a run (bad input otherwise); an empty one has nothing to stop (exit 1)."""
    log = tmp_path / "log"
    with pytest.raises(say.BadInput) as bad:
        stop_run(parse(["--stop", "--log-path", str(log)]), "/")
    assert bad.value.message == (
        f"--stop needs the --log-path of a run (an existing absolute path; got '{log}'); "
        "give the --log-path the run was started with"
    )
    log.mkdir()
    with pytest.raises(say.Die) as nothing:
        stop_run(parse(["--stop", "--log-path", str(log)]), "/")
    assert (nothing.value.code, nothing.value.message) == (
        1,
        f"nothing to stop: no run.sh of --log-path {log} runs on this host",
    )


def test_stop_signals_the_owner_on_this_host(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    """A single-node run.sh is stopped by SIGTERM to the owner its record names (pid and start time);
    a record whose start time differs (a reused pid) is left alone, and so is owner.lock."""
    owner, reused = sleepers
    layout, host = Layout(tmp_path / "log"), socket.gethostname()
    layout.rank_dir(0).mkdir(parents=True)
    layout.rank_dir(0).joinpath("owner.lock").write_text("")
    layout.owner(0, "update").write_text(f"{host} {reused.pid} {pid_started(reused.pid) + 1}\n")
    layout.owner(0, "rollout").write_text(f"{host} {owner.pid} {pid_started(owner.pid)}\n")
    stop_run(parse(["--stop", "--log-path", str(layout.root)]), "/")
    assert owner.wait(timeout=10) == -signal.SIGTERM and reused.poll() is None
    assert capsys.readouterr().err == f"[baton] sent SIGTERM to run.sh (pid {owner.pid}, rollout)\n"
