"""The coordinator owns the run's state and decisions: config routing, the
per-iteration summary and plot, the serving dtype and KV cache, and the
multi-node protocol (run record, start and join, heartbeats, barriers: cluster.py, membership.py,
heartbeat.py, barrier.py). scripts/run.sh asks it through one entry point:

    python -m coordinator compose --data-path D --log-path L --base-model M \
        [--debug-mode] [--save F] -- OVERRIDES...
    python -m coordinator summarize --log-path L --iteration N [--served-version V]
    python -m coordinator keep-best --log-path L --iteration N --margin P --base-model M   (keep_best.py)
    python -m coordinator plot --log-path L
    python -m coordinator table --log-path L
    python -m coordinator fingerprint --base-url URL --model NAME
    python -m coordinator serving --device cpu|cuda --model DIR [--sessions N] [--max-model-len L] [--record F]
    python -m coordinator heartbeat|stop|status ...   (protocol_cli.py; the driver runs the rest in-process)
    python -m coordinator takeover-plan --config C --dead D --survivors 0,2   (reassign.py; the driver calls it)
    python -m coordinator aggregate ... [--takeover-plan trajectories/<split>/iter_NNNN/takeover.json]
    python -m coordinator dashboard --log-path L [--port P] [--host H]   (the run's web page: dashboard/)

It imports rollout_engine and training, never the reverse (tests/unit/test_layering.py);
importing the package does nothing; run.sh calls the entry point in the app environment.
"""
