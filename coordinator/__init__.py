"""Run state and decisions of Baton: iteration numbering, markers, the multi-node
protocol (cluster, barrier, heartbeat) and the helpers run.sh calls.

The package imports rollout_engine and training, never the reverse; importing it
does no work.
"""
