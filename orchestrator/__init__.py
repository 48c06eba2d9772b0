"""Helpers of scripts/run.sh that are easier in Python than in bash.

    python -m orchestrator compose --data-path D --log-path L --base-model M [--debug-mode] [--save F] -- OVERRIDES...
    python -m orchestrator summarize --log-path L --iteration N [--served-version V]
    python -m orchestrator plot --log-path L
    python -m orchestrator table --log-path L
    python -m orchestrator fingerprint --base-url URL --model NAME

Importing the package does nothing; run.sh calls the entry point in the app environment.
"""
