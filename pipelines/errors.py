"""The errors a user's own input can cause: the entry points print their message as one line (no traceback).

Every error that names a bad config key, manifest line, table column or changed input derives from `UserInputError`,
so `pipelines.cli.run_main` tells them from bugs (which keep their traceback).
"""
from __future__ import annotations


class UserInputError(ValueError):
    """Bad input from the user (config, manifest, table, folder); the message names the file or key and what is allowed."""


class ConfigError(UserInputError):
    """A malformed config: the message names the key and what is allowed."""
