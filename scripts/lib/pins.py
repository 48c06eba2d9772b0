"""Print one environment's install recipe from pyproject.toml.

Usage: python3 scripts/lib/pins.py <env> [--hash]

`<env>` names a table under [tool.baton.envs] in pyproject.toml (app,
serve-cpu, serve-gpu, train). The recipe is printed as tab-separated lines that
scripts/setup.sh executes in order:

    install <requirement>...      pip install of an extra of [project.optional-dependencies]
    install --no-deps <req>...    (or other pip flags first)
    remove <dist>...              pip uninstall -y
    import <module>...            verification: the modules must import
    resource <module> <path>      verification: the package ships that file
    command <argv...>             verification: the command must succeed

With --hash it prints a short hash of the recipe and the interpreter's version;
the cached environment is keyed by it, so changing a pin rebuilds it.
"""

import hashlib
import sys
import tomllib
from pathlib import Path


def recipe(name: str) -> list[list[str]]:
    """Expand an environment's table into executable recipe lines."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    envs = pyproject["tool"]["baton"]["envs"]
    if name not in envs:
        raise SystemExit(f"pins.py: unknown environment {name!r}; known: {', '.join(sorted(envs))}")
    extras = pyproject["project"]["optional-dependencies"]
    lines: list[list[str]] = []
    for step in envs[name]["steps"]:
        kind, _, arg = step.partition(" ")
        if kind == "extra":
            lines.append(["install", *extras[arg]])
        elif kind in ("install", "remove", "import", "resource", "command"):
            lines.append([kind, *arg.split()])
        else:
            raise SystemExit(f"pins.py: bad step {step!r} in [tool.baton.envs.{name}]")
    return lines


def main(argv: list[str]) -> int:
    lines = recipe(argv[1])
    if "--hash" in argv[2:]:
        blob = repr((lines, sys.version_info[:2])).encode()
        print(hashlib.sha256(blob).hexdigest()[:12])
    else:
        print("\n".join("\t".join(line) for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
