"""Baton's asynchronous rollout engine (library; importing it does no work).

Run one rollout of one rank with
`python -m rollout_engine --config-name rollout_train|rollout_test key=value ...`
(docs/rollout.md).
"""
