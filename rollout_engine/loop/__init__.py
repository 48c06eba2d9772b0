"""Helpers of scripts/run.sh that are easier in Python than in bash.

    python -m rollout_engine.loop compose --data-path D --log-path L --base-model M \
        [--debug-mode] [--save F] -- OVERRIDES...
    python -m rollout_engine.loop summarize --log-path L --iteration N [--served-version V]
    python -m rollout_engine.loop plot --log-path L
    python -m rollout_engine.loop table --log-path L
    python -m rollout_engine.loop fingerprint --base-url URL --model NAME
    python -m rollout_engine.loop serving --device cpu|cuda --model DIR [--sessions N] [--max-model-len L] [--record F]

Importing the package does nothing; run.sh calls the entry point in the app environment.
"""
