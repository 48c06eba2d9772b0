"""The driver: one Python process owns a run.sh run from start to end.

`scripts/run.sh` finds the app environment and execs `python -m coordinator.driver "$@"`
(so the driver keeps run.sh's pid: `run.sh --stop` and the owner records name it).

    cli.py        the command line: flags, usage, every rule of the argument table (exit 2)
    say.py        [baton] lines on stderr, and the exceptions that end the run with an exit code
    stop.py       --stop: ask a multi-node run to stop, else SIGTERM this host's run.sh of the log path
    procs.py      process groups: start in a new session, record, stop exactly those; role claims
    supervise.py  waiting for a child while the run's watches (heartbeat, peers, signals) tick
    vllm.py       the policy server: arguments, start, reuse, reload, sleep/wake, stop
    nodes.py      one node of a multi-node run: start/join, heartbeat, plans, barriers, leave
    loop.py       the steps: plan, rollouts, takeover, keep-best, update, serve, finish
    run.py        main: --help, --stop, --dry-run, a run (claims, traps, clean-up)

Imports go one way: run -> loop -> (nodes, vllm) -> (supervise, procs) -> say; the driver
imports coordinator/, rollout_engine/ and training's light modules, and nothing imports it.
"""
