"""What --resume reads of the interrupted iteration, read before anything starts.

    check_resume(run.layout, run.rank)   # say.BadInput (exit 2) naming the file (and line) and the fix

The interrupted iteration's journals of this rank (its own and those of the episodes it took over) and their
manifests, and on the master the merged manifests: the rollout and the merge would meet them only after vLLM
started. A torn line is a crash's and no error (its episode runs again); a line that parses but is not a
trajectory, an episode journaled twice, or a manifest that is not a JSON object is a file Baton did not
write, and the run refuses to build on it.
"""

from __future__ import annotations

from pathlib import Path

from coordinator import runstate
from coordinator.driver.say import BadInput
from rollout_engine.config import SPLITS
from rollout_engine.errors import ConfigError
from rollout_engine.files import parse_jsonl
from rollout_engine.journal import load_manifest, trajectory_of
from rollout_engine.layout import MERGED_MANIFEST, Layout, parse_journal_name

FIX = "move the file aside (its episodes run again) and rerun with --resume"


def check_resume(layout: Layout, rank: int) -> None:
    """Read what --resume will read on this rank; BadInput for the first file it cannot build on."""
    iteration = runstate.next_iteration(layout.root)
    if not layout.state_dir(iteration).is_dir():
        return  # nothing was interrupted: the run starts a new iteration
    for split in SPLITS:
        folder = layout.iteration_dir(split, iteration)
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            named = parse_journal_name(path.name)
            if named is not None and named[0] == rank:
                _check_journal(path)
            elif (path.name.startswith(f"rank_{rank}.") and path.name.endswith(".manifest.json")) or (
                rank == 0 and path.name == MERGED_MANIFEST
            ):
                _check_manifest(path)


def _check_journal(path: Path) -> None:
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise BadInput(f"--resume: the journal {path} is a folder, not a file; {FIX}") from None
    except OSError as exc:
        raise BadInput(f"--resume: the journal {path} cannot be read ({exc.strerror}); {FIX}") from None
    seen: dict[str, int] = {}
    read = parse_jsonl(data)
    for number, row in zip(read.numbers, read.rows, strict=True):
        try:
            episode = trajectory_of(row, f"the journal {path}:{number}", FIX).episode_id
        except ConfigError as exc:
            raise BadInput(f"--resume: {exc.problems[0]}") from None
        if episode in seen:
            raise BadInput(
                f"--resume: the journal {path}:{number} repeats episode {episode!r} (first on line {seen[episode]}); "
                f"{FIX}"
            )
        seen[episode] = number


def _check_manifest(path: Path) -> None:
    try:
        load_manifest(path)
    except ConfigError as exc:
        raise BadInput(f"--resume: {exc.problems[0]}") from None
    except OSError as exc:
        raise BadInput(f"--resume: the manifest {path} cannot be read ({exc.strerror}); {FIX}") from None
