"""Environments, one per file, each a few hooks over the loop in `base.Env`."""
