"""The one exception type the CLI turns into a one-line error and an exit code.

Every failure a user can cause (bad config, bad lock, tampered file, missing
daemon) is raised as a HermeticError with a message that names the culprit;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


# Verdicts that are not errors: `hermetic diff` / `replay` compare and say what they found.
EXIT_DIFFERENT = 1  # the two runs (or groups) differ
EXIT_NOTHING_COMPARED = 66  # neither run has an output file or a metric: nothing was compared (sysexits EX_NOINPUT)


class HermeticError(Exception):
    """A user-facing failure: one line, names the culprit, nonzero exit."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int | None = None,
                 details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = list(details or [])  # lines printed before the error line (e.g. each changed file)
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class ConfigError(HermeticError):
    """hermetic.yaml is unreadable or invalid (exit 2, like a usage error)."""

    exit_code = 2


class LockError(HermeticError):
    """A lockfile cannot be trusted as written (missing hash, not pinned, sdist only...)."""

    exit_code = 2


class IntegrityError(HermeticError):
    """Bytes did not match their expected digest."""

    exit_code = 3


class EngineError(HermeticError):
    """The Docker Engine is missing, unreachable or lacks a needed runtime."""

    exit_code = 4


class MissingExtra(HermeticError):
    """An optional feature's package is not installed (exit 2, like a usage error):
    the message names the extra that brings it, e.g. ``pip install 'hermetic[plots]'``."""

    exit_code = 2

    def __init__(self, feature: str, extra: str, module: str):
        super().__init__(f"{feature} needs {module}, which is not installed: pip install 'hermetic[{extra}]'")
        self.extra = extra
