"""Write guess-the-number task files in Baton's format (docs/formats.md in Baton):

    python -m my_envs.tasks DIR [--train 96] [--test 24] [--seed 0]    # DIR/train.jsonl, DIR/test.jsonl

Ranges 1..8, 1..16 and 1..32 in turn (difficulty 1, 2, 3; family guess-1-<high>), secrets drawn from the
seed; the test file has its own ids and secrets.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

HIGHS = (8, 16, 32)


def build_tasks(count: int, seed: int, prefix: str) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        difficulty = index % len(HIGHS) + 1
        high = HIGHS[difficulty - 1]
        rows.append(
            {
                "task_id": f"{prefix}-{index:04d}",
                "task_name": f"Guess a number from 1 to {high}",
                "difficulty": difficulty,
                "env": "guess",
                "family": f"guess-1-{high}",
                "metadata": {"low": 1, "high": high, "secret": rng.randint(1, high)},
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for train.jsonl and test.jsonl")
    parser.add_argument("--train", type=int, default=96)
    parser.add_argument("--test", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for split, count, seed in (("train", args.train, args.seed), ("test", args.test, args.seed + 1)):
        path = args.out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in build_tasks(count, seed, split)))
        print(path)


if __name__ == "__main__":
    main()
