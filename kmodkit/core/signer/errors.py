"""The one error the signer reports: its message is what the user reads."""

from __future__ import annotations


class SignerError(Exception):
    """Signing failed; the message says what is wrong and what to do, and never holds a
    credential or a byte of the key."""


class UsageError(SignerError):
    """The command line is wrong (exit code 2, as for any usage error)."""
