# Sourced by bats files (bats `load run_record`) that need a multi-node run's record for the heartbeat or
# run.sh --stop: the master's start as the driver makes it, in-process (coordinator.membership.start_run).
# Needs ROOT and scripts/lib/envs.sh.
# shellcheck shell=bash

# start_run <log> <num nodes> <node pid>: start a run on <log> as its master, with
# <node pid> as the master's node, equal rank weights, a beat every 0.1 s and death after 1 s of silence;
# print its run id.
start_run() {
  PYTHONPATH="$ROOT" "$(envs_python app)" -c '
import socket
import sys

from coordinator.cluster import Endpoint
from coordinator.membership import start_run

log, nodes, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
me = Endpoint(socket.gethostname(), "127.0.0.1", pid)
record = start_run(log, nodes, [1] * nodes, me=me, heartbeat_interval_s=0.1, dead_after_s=1)
print(record.run_id)
' "$@"
}
