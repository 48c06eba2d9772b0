"""The driver: one Python process owns a run.sh run from start to end.

`scripts/run.sh` finds the app environment and execs `python -m coordinator.driver "$@"`
(so the driver keeps run.sh's pid: `run.sh --stop` and the owner records name it).

    run.py        main: --help, --stop, --dry-run, a run (compose once, claims, signals, clean-up)
    dryrun.py     --dry-run: the commands the next iteration's phases would run
    loop.py       the steps: the plan of each (master decides, workers receive), begin, serve, finish
    rollout.py    a rollout phase: restarts of a dead server, the barrier, the takeover, --keep-best
    update.py     the update: its command, the check, one node's and several nodes' update, stopping it
    trainer.py    the warm trainer: started once per run and node, handed each update, noticed when it ends
    phase.py      one phase as a tracked group with its live view; the master's markers and times
    context.py    Run: everything one run knows (its arguments, children, counters)
    nodes.py      one node of a multi-node run: start/join, heartbeat, plans, barriers, leave
    vllm.py       the policy server: arguments, start, reuse, reload, sleep/wake, stop
    cli.py        the command line: flags, usage, every rule of the argument table (exit 2)
    stop.py       --stop: ask a multi-node run to stop, else SIGTERM this host's run.sh of the log path
    supervise.py  every wait: a child, a blocking call, a sleep, while the run's watches tick
    procs.py      process groups: start in a new session, record, stop exactly those; role claims
    shellquote.py bash's printf %q, for --dry-run's lines
    say.py        [baton] lines on stderr, and the exceptions that end the run with an exit code

Imports go one way, down this list (run -> loop -> rollout/update -> phase -> context -> trainer/nodes/vllm ->
cli/supervise/procs -> say); the driver imports coordinator/, rollout_engine/ and training's light modules,
and no product module imports it.
"""
