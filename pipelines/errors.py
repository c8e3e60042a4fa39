"""The errors a user's own input can cause: the entry points print their message as one line (no traceback).

Every error that names a bad config key, manifest line, table column or changed input derives from `UserInputError`,
so `pipelines.cli.run_main` tells them from bugs (which keep their traceback).
"""
from __future__ import annotations

import difflib
from collections.abc import Sequence


class UserInputError(ValueError):
    """Bad input from the user (config, manifest, table, folder); the message names the file or key and what is allowed,
    and `doc` (optional) where that input is documented: a README section or a docs/ file, never outside the
    repository."""

    doc: str | None = None

    def __init__(self, *args: object, doc: str | None = None):
        super().__init__(*args)
        if doc is not None:
            self.doc = doc


class ConfigError(UserInputError):
    """A malformed config: the message names the key and what is allowed."""


def closest(word: str, choices: Sequence[str]) -> str:
    """' (did you mean 'x'?)' for the closest of `choices`, else ' (allowed: a, b, ...)'; '' with no choices."""
    if not choices:
        return ""
    match = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {match[0]!r}?)" if match else f" (allowed: {', '.join(sorted(choices))})"
