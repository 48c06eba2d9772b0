"""Print one environment's install recipe from pyproject.toml and its lock file.

Usage: python3 scripts/lib/pins.py <recipe> [--unlocked]
       python3 scripts/lib/pins.py <recipe>... --hash

`<recipe>` names a table under [tool.baton.envs] in pyproject.toml (app,
serve-cpu, serve-cuda, train). The recipe is printed as tab-separated lines
that scripts/setup.sh executes in order:

    install -c <lock> [flags] <req>...   pip install of an extra of [project.optional-dependencies]
    remove <dist>...                     pip uninstall -y
    site <file>...                       copy repository files into the environment's site-packages
    import <module>...                   verification: the modules must import
    resource <module> <path>             verification: the package ships that file
    command <argv...>                    verification: the command must succeed

`<lock>` is scripts/locks/<recipe>.txt, every package of the environment pinned
(`pip freeze` output, made by scripts/lock.sh): the extras name the packages we
use, the lock pins everything they pull in. `--unlocked` prints the install
lines without it (scripts/lock.sh builds from those).

With --hash it prints, for each recipe named, one line: a short hash of the recipe, the lock's content, the
content of the files `site` steps copy and the interpreter's version; the
cached environment is keyed by it, so changing a pin, top-level or transitive,
or a copied file rebuilds it.
"""

import hashlib
import sys
import tomllib
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]
STEP_KINDS = ("remove", "site", "import", "resource", "command")


def fail(message: str) -> NoReturn:
    """Bad input (an unknown recipe, a bad step, a missing lock): one line on stderr, exit 2."""
    print(f"pins.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def lock_path(name: str) -> Path:
    """The lock file of recipe `name`, relative to the repository root."""
    return Path("scripts") / "locks" / f"{name}.txt"


def recipe(name: str, lock: str | None) -> list[list[str]]:
    """Expand a recipe's table into executable lines; installs are constrained by `lock` unless it is None."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    envs = pyproject["tool"]["baton"]["envs"]
    if name not in envs:
        fail(f"unknown environment {name!r}; known: {', '.join(sorted(envs))}")
    extras = pyproject["project"]["optional-dependencies"]
    constraints = ["-c", lock] if lock is not None else []
    lines: list[list[str]] = []
    for step in envs[name]["steps"]:
        kind, *args = step.split()
        if kind == "extra" and args and args[0] in extras:
            lines.append(["install", *constraints, *args[1:], *extras[args[0]]])
        elif kind == "site" and (missing := [a for a in args if not (ROOT / a).is_file()]):
            fail(f"step {step!r} in [tool.baton.envs.{name}]: {', '.join(missing)} is no file of the repository")
        elif kind in STEP_KINDS and args:
            lines.append([kind, *args])
        else:
            fail(
                f"bad step {step!r} in [tool.baton.envs.{name}]; steps are `extra <name of an extra> "
                f"[pip flags]`, `site <repository file>...` or one of {', '.join(STEP_KINDS)}"
            )
    return lines


def read_lock(name: str) -> str:
    path = ROOT / lock_path(name)
    if not path.is_file():
        fail(f"{lock_path(name)} is missing; make it with: bash scripts/lock.sh {name}")
    return path.read_text()


def env_hash(name: str) -> str:
    """The cache key: the recipe (lock named relative to the checkout), the lock's content, the files `site` steps
    copy, Python's version."""
    lines = recipe(name, str(lock_path(name)))
    copied = [(ROOT / path).read_bytes() for kind, *paths in lines if kind == "site" for path in paths]
    key = (lines, read_lock(name), sys.version_info[:2])
    # (a recipe without `site` steps keeps the key it had before they existed: no rebuild for nothing)
    blob = repr((*key, copied) if copied else key).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def main(argv: list[str]) -> int:
    names, flags = [a for a in argv[1:] if not a.startswith("-")], [a for a in argv[1:] if a.startswith("-")]
    if "--hash" in flags and names:  # several at once: envs_export keys three environments with one interpreter
        print("\n".join(env_hash(name) for name in names))
        return 0
    if len(names) != 1 or argv[1].startswith("-"):
        fail("usage: python3 scripts/lib/pins.py <recipe> [--unlocked], or <recipe>... --hash")
    name = names[0]
    if "--unlocked" in flags:
        lines = recipe(name, None)
    else:
        read_lock(name)
        lines = recipe(name, str(ROOT / lock_path(name)))
    print("\n".join("\t".join(line) for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
