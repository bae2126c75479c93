"""Exceptions raised by Foundry. Each maps one native status code."""

from __future__ import annotations


class FoundryError(RuntimeError):
    """Base class of every error Foundry raises."""

    status: int = -1


class InvalidArgumentError(FoundryError, ValueError):
    status = 1


class CudaError(FoundryError):
    status = 2


class NoDriverError(FoundryError):
    status = 3


class NoContextError(FoundryError):
    status = 4


class StateError(FoundryError):
    status = 5


class FixedAddressError(FoundryError):
    status = 6


class RegionExhaustedError(FoundryError, MemoryError):
    status = 7


class DivergenceError(FoundryError):
    status = 8


class ArchiveIOError(FoundryError, OSError):
    status = 9


class FormatError(FoundryError):
    status = 10


class VersionError(FoundryError):
    status = 11


class UnsupportedError(FoundryError):
    status = 12


class NotFoundError(FoundryError, LookupError):
    status = 13


class BusyError(FoundryError):
    status = 14


class AuditError(FoundryError):
    status = 15


class MismatchError(FoundryError):
    status = 16


_BY_STATUS = {
    cls.status: cls
    for cls in (
        InvalidArgumentError, CudaError, NoDriverError, NoContextError, StateError, FixedAddressError,
        RegionExhaustedError, DivergenceError, ArchiveIOError, FormatError, VersionError, UnsupportedError,
        NotFoundError, BusyError, AuditError, MismatchError,
    )
}


def error_for_status(status: int, message: str) -> FoundryError:
    """The exception for a native status code and its message."""
    return _BY_STATUS.get(status, FoundryError)(message or f"foundry status {status}")
