"""Check the policy server's arguments with vLLM's own parser, in the serve environment (run.sh --dry-run).

    <serve python> -I coordinator/vllm_argcheck.py ARGS...    # ARGS: the server's, after `-m <module>`

vLLM's server builds its parser with `make_arg_parser` and checks what it parsed with
`validate_parsed_serve_args` before it starts anything (vllm/entrypoints/launchers/cli_args.py in vLLM 0.32;
vllm/entrypoints/openai/cli_args.py before): this runs the same two. Exit 0 when they accept the arguments;
2 when they refuse them, with vLLM's words on the last line of stdout after `refused: `. Imports vLLM and the
standard library only, and runs with -I (isolated): the script's folder must not be on sys.path, where a
module of this repository could shadow the vllm package.
"""

from __future__ import annotations

import contextlib
import io
import sys

PROG = "vllm"
MARK = "refused: "


def _vllm_parser():
    """vLLM's server parser and its check of the parsed arguments."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # vLLM before the launchers package
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    return make_arg_parser(FlexibleArgumentParser(prog=PROG)), validate_parsed_serve_args


def check(argv: list[str]) -> str | None:
    """vLLM's refusal of the server arguments `argv` (argparse's message, or its check's), None when accepted."""
    parser, validate = _vllm_parser()
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = parser.parse_args(argv)
    except SystemExit as exc:
        lines = said.getvalue().splitlines()
        errors = [line.removeprefix(f"{PROG}: error: ") for line in lines if line.startswith(f"{PROG}: error: ")]
        return (errors or lines or [f"the parser exited {exc.code}"])[-1]
    try:
        validate(args)
    except (TypeError, ValueError) as exc:
        return str(exc).removeprefix("Error: ")
    return None


def main() -> int:
    refused = check(sys.argv[1:])
    if refused is None:
        return 0
    print(f"{MARK}{refused}", flush=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
