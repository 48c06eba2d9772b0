"""`python -m coordinator.driver ...`: run.sh's command line (TEMPORARY: run.py's `main` replaces this).

For now: --help, --stop, and the checks of a run's command line (the argument table, the node file,
Slurm's default address); bad input exits 2 with run.sh's message. A run itself is still run.sh's
Bash: for a command line that passes, this exits 0 and prints nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

from coordinator.driver import cli, say
from coordinator.driver.stop import stop_run

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    """The command line's part of run.sh's main; the exit code."""
    try:
        args = cli.parse(argv)
        if args.help:
            print(cli.usage())
            return 0
        if args.stop:
            stop_run(args, str(ROOT))
            return 0
        cli.validate(args)
        cli.apply_node_file(args)
        cli.slurm_default_addr(args)
    except say.Ended as exc:
        for line in say.error_lines(exc):
            print(line, file=sys.stderr, flush=True)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
