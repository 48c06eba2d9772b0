"""`python -m coordinator track --log-path L`: log the new metrics.jsonl records to the run's trackers.

The trackers are the `update.tracker` node of the run's resolved config
(`<log>/run/rank_0/resolved.yaml`, the master's); run.sh calls this on the
master after each iteration's summary when one is chosen. Prints how many
records were logged (0 when every tracker is up to date). See coordinator/trackers.py.
A call holds `<log>/trackers/.track.lock`: one started by hand while run.sh's
runs would otherwise log the same records twice and delete the other's outputs
(files its cursor does not list yet).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rollout_engine.errors import ConfigError
from rollout_engine.files import shared_lock
from rollout_engine.layout import Layout


def cmd_track(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    from coordinator.trackers import build_trackers, track

    resolved = Layout(args.log_path).resolved(0)  # the master's
    if not resolved.is_file():
        where = resolved.relative_to(args.log_path)
        raise ConfigError(f"--log-path has no {where} (got {args.log_path!r}); pass the log path of a run")
    tracker_cfg = OmegaConf.to_container(OmegaConf.load(resolved)).get("update", {}).get("tracker")
    lock = Layout(args.log_path).trackers / ".track.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with shared_lock(lock):
        print(track(Path(args.log_path), build_trackers(tracker_cfg, args.log_path)))
    return 0


def add_track(sub: argparse._SubParsersAction) -> None:
    """Register the `track` subcommand."""
    parser = sub.add_parser("track", help="master: log the new metrics.jsonl records to the configured trackers")
    parser.add_argument("--log-path", required=True)
    parser.set_defaults(func=cmd_track)
