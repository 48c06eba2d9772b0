"""A stand-in for `python -m training.warm` (training/warm.py) in the driver's tests: the same files, no training.

fake_warm_trainer.py -m training.warm --dir D --log L

Writes D/ready.json, then answers each D/job.json with D/done.0.json. A job's argv decides its outcome:
`fake.exit=N` (default 0), `fake.die` (the process exits mid-job, as a SIGKILLed worker would leave it),
`fake.hang` (it never answers; D/started.json names the job's launch.timeout_s, as the worker's does),
`fake.keep=MiB` (the tensors its report says stayed alive after the job, default 0). Each
job appends "pid argv..." to D/jobs.log. Run without --dir (as `python -m training`), it prints its arguments and
exits 0. FAKE_TRAINER_START=exit makes it exit before it is ready, =hang makes
it never ready.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    if "--dir" not in sys.argv:  # `python -m training ...`: the fresh path
        print("fresh update:", " ".join(sys.argv[1:]))
        return
    args = sys.argv[sys.argv.index("--dir") + 1 :]
    directory = Path(args[0])
    directory.mkdir(parents=True, exist_ok=True)
    start = os.environ.get("FAKE_TRAINER_START", "ok")
    if start == "exit":
        sys.exit(1)
    while start == "hang":
        time.sleep(1)
    (directory / "ready.json").write_text(json.dumps({"pid": os.getpid(), "nproc": 1}))
    done = 0
    while True:
        try:
            job = json.loads((directory / "job.json").read_text())
        except (OSError, ValueError):
            job = {"seq": 0}
        if job["seq"] <= done:
            time.sleep(0.02)
            continue
        with open(directory / "jobs.log", "a") as out:
            out.write(" ".join([str(os.getpid()), *job["argv"]]) + "\n")
        timeout = next((float(a.split("=", 1)[1]) for a in job["argv"] if a.startswith("launch.timeout_s=")), 3600.0)
        (directory / "started.json").write_text(json.dumps({"seq": job["seq"], "timeout_s": timeout}))
        if "fake.die" in job["argv"]:
            os._exit(9)
        while "fake.hang" in job["argv"]:  # a stopped or hung worker: no watchdog of its own ends it
            time.sleep(1)
        code = next((int(a.split("=", 1)[1]) for a in job["argv"] if a.startswith("fake.exit=")), 0)
        Path(job["log"]).write_text(f"update job {job['seq']}: exit {code}\n")
        tmp = directory / "done.0.json.tmp"
        kept = next((float(a.split("=", 1)[1]) for a in job["argv"] if a.startswith("fake.keep=")), 0.0)
        tmp.write_text(json.dumps({"seq": job["seq"], "exit": code, "wall_s": 0.0, "tensors_alive_mib": kept}))
        tmp.replace(directory / "done.0.json")
        done = job["seq"]


if __name__ == "__main__":
    main()
