"""The one error hierarchy of the rollout engine.

`ConfigError` (bad input) ends a run before any work with exit code 2. The
others are raised inside one episode, recorded on its trajectory as a failure
kind (see `rollout_engine.types.Failure`) and counted; they never kill the batch.
"""

from __future__ import annotations


class BatonError(Exception):
    """Base of every error the engine raises on purpose."""


class ConfigError(BatonError):
    """Bad input: an invalid config value, task file or environment choice.

    The message names the field, the value and the fix; one error may carry
    several problems, one per line.
    """

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class EnvError(BatonError):
    """The environment failed (a browser, a game, a task that cannot be set up)."""


class ModelError(BatonError):
    """The policy server failed after all retries, or replied with nothing usable."""


class ContextOverflowError(ModelError):
    """The prompt no longer fits the model's context window."""


class JudgeError(BatonError):
    """The judge failed after all retries or gave an unparseable verdict."""


class InfraError(BatonError):
    """A shared resource is unusable (unreachable server): stop the whole run."""


class PolicyDown(InfraError):
    """The policy server stopped answering during the rollout (it died, or its engine did): not the
    episode's fault. The rollout stops with the journal incomplete; run.sh restarts vLLM and resumes."""


def disk_full(exc: BaseException) -> str | None:
    """The one line to print for a write that failed because a filesystem is full (ENOSPC, or EDQUOT: a
    quota), found anywhere in the exception's chain; None for any other error."""
    import errno

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f" writing {seen.filename}" if seen.filename else ""
            return (
                f"no space left on the device{where} ({seen.strerror}); free space on that filesystem (the log "
                "path: old training/iter_* outputs, promotion.keep_last), then rerun with --resume"
            )
        seen = seen.__cause__ or seen.__context__
    return None
