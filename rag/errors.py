"""Named exceptions whose messages are safe to show to a user and say what to do."""

from __future__ import annotations

from datetime import datetime


class RagError(Exception):
    """Base class: the message is meant for the person using the tool."""


class ExtensionLoadError(RagError):
    """sqlite-vec could not be loaded into any available SQLite build."""


class IndexMismatchError(RagError):
    """The database was built with another embedding model (or dimension/metric)."""


class ModelLoadError(RagError):
    """A model file or directory is missing or unreadable."""


class ExtractionError(RagError):
    """A document could not be turned into text (corrupt, encrypted, empty, undecodable)."""


class QueryError(RagError):
    """A question or search request cannot be run as given."""


class NotFoundError(RagError):
    """A named collection, document or run does not exist."""


class StorageError(RagError):
    """The database file cannot be used as it is; the message names the file and the fix."""


class AuthError(RagError):
    """Team mode refused a sign-in (wrong name or password, a disabled account) or a user change."""


class LockedOutError(AuthError):
    """Too many failed sign-ins for one name: ``retry_at`` (UTC) says when to try again."""

    def __init__(self, message: str, retry_at: datetime) -> None:
        super().__init__(message)
        self.retry_at = retry_at


class PermissionDeniedError(RagError):
    """The signed-in user's role does not allow the action."""
