"""Environments of my own for Baton: `my_envs.guess.GuessNumberEnv` (docs/environments.md in Baton)."""
