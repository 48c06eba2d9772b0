"""Generate the default task files from reasoning-gym, deterministically.

    python -m rollout_engine.default_tasks --data-path D [--test-fraction 0.2] [--seed 0]

writes D/tasks/train.jsonl, D/tasks/test.jsonl and D/tasks/tasks.json (the
settings and each file's sha256). The tasks are one-digit, two-term sums and
differences in two phrasings (reasoning-gym's `chain_sum` and
`basic_arithmetic`): the default model solves about 8% of samples at
temperature 1 (FACTS.md), enough successes for filtered behaviour cloning to
learn from. Train and test are disjoint by arithmetic expression, so no test
question is seen in training in either phrasing. Existing files with the same
settings and checksums are left alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

from rollout_engine.exits import Exit
from rollout_engine.files import save_bytes

#: reasoning-gym generator settings for each task family
FAMILIES: dict[str, dict[str, Any]] = {
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "operators": ["+", "-"],
        "allow_parentheses": False,
        "allow_negation": False,
    },
}
POOL_SIZE = 2000  # items drawn per family; enough to cover every expression


def _items(family: str, seed: int) -> dict[str, dict[str, Any]]:
    """First generated item for each distinct expression of one family."""
    import reasoning_gym

    config = dict(FAMILIES[family])
    if "operators" in config:
        config["operators"] = tuple(config["operators"])
    dataset = reasoning_gym.create_dataset(family, size=POOL_SIZE, seed=seed, **config)
    by_expression: dict[str, dict[str, Any]] = {}
    for item in dataset:
        by_expression.setdefault(item["metadata"]["expression"], json.loads(json.dumps(item)))
    return by_expression


def build_tasks(seed: int, test_fraction: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return (train, test) task rows, disjoint by expression."""
    pools = {family: _items(family, seed) for family in FAMILIES}
    expressions = sorted(set.intersection(*(set(p) for p in pools.values())))
    random.Random(seed).shuffle(expressions)
    n_test = max(1, round(len(expressions) * test_fraction))
    splits = {"test": expressions[:n_test], "train": expressions[n_test:]}
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    for split, exprs in splits.items():
        for expression in exprs:
            for family in FAMILIES:
                item = pools[family][expression]
                index = len(rows[split])
                rows[split].append(
                    {
                        "task_id": f"{split}-{family}-{index:04d}",
                        "task_name": item["question"],
                        "difficulty": 1,
                        "env": "reasoning_gym",
                        "family": family,
                        "definite_answer": item["answer"],
                        "metadata": {"dataset": family, "config": FAMILIES[family], "seed": seed, "entry": item},
                    }
                )
    return rows["train"], rows["test"]


def _dump(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()


def prepare(data_path: Path, seed: int = 0, test_fraction: float = 0.2) -> Path:
    """Write the default task files under data_path/tasks (skipped if current)."""
    out = data_path / "tasks"
    settings = {"seed": seed, "test_fraction": test_fraction, "families": FAMILIES}
    manifest_path = out / "tasks.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        files = manifest.get("files", {})
        if (
            manifest.get("settings") == settings
            and files
            and all(
                (out / name).is_file() and hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
                for name, digest in files.items()
            )
        ):
            return out
    train, test = build_tasks(seed, test_fraction)
    out.mkdir(parents=True, exist_ok=True)
    blobs = {"train.jsonl": _dump(train), "test.jsonl": _dump(test)}
    for name, blob in blobs.items():
        save_bytes(out / name, blob)
    manifest = {
        "settings": settings,
        "counts": {"train.jsonl": len(train), "test.jsonl": len(test)},
        "files": {name: hashlib.sha256(blob).hexdigest() for name, blob in blobs.items()},
    }
    save_bytes(manifest_path, (json.dumps(manifest, indent=2) + "\n").encode())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate Baton's default reasoning-gym task files.")
    parser.add_argument("--data-path", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--test-fraction", type=float, default=0.2)
    args = parser.parse_args(argv)
    if not 0 < args.test_fraction < 1:
        print(f"error: --test-fraction must be between 0 and 1 (got {args.test_fraction})", file=sys.stderr)
        return Exit.BAD_INPUT
    out = prepare(args.data_path.resolve(), args.seed, args.test_fraction)
    counts = json.loads((out / "tasks.json").read_text())["counts"]
    print(f"[baton] tasks ready: {out} (train {counts['train.jsonl']}, test {counts['test.jsonl']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
