"""tsar.Error and tsar.ErrorCode: the one exception type, as in C++ (include/tsar/error.h)."""
import enum


class ErrorCode(enum.IntEnum):
    """Stable error codes; the values are those of C++ ``tsar::ErrorCode`` and of spec/FORMAT.md §6."""

    IO = 1
    NOT_FOUND = 2
    INVALID_ARGUMENT = 3
    TRUNCATED = 4
    BAD_MAGIC = 5
    UNSUPPORTED_VERSION = 6
    RESERVED_NON_ZERO = 7
    OUT_OF_BOUNDS = 8
    OVERLAP = 9
    MISALIGNED = 10
    OVERFLOW = 11
    BAD_DTYPE = 12
    BAD_SHAPE = 13
    DUPLICATE_NAME = 14
    CHECKSUM_MISMATCH = 15
    INVALID_VALUE = 16
    BAD_INPUT = 17
    UNSUPPORTED = 18
    BIND_MISMATCH = 19
    BASE_MISMATCH = 20

    # An IntEnum prints as its number (``print(e.code)`` gave ``2``): the name
    # says what happened. It still is the int, and compares equal to it.
    def __str__(self):
        return self.name

    def __format__(self, spec):
        if spec and spec[-1] in "bcdoxXn":  # a numeric format: f"{code:d}", f"{code:#x}"
            return int.__format__(int(self), spec)
        return format(self.name, spec)


class Error(RuntimeError):
    """Raised for any bad archive, bad input file, I/O failure or misuse.

    ``str(error)`` is the same one-line message as C++ ``what()``:
    ``<path>: offset <dec> (0x<hex>): <field>: expected <x>, found <y>`` when the
    error is about a byte of a file, ``<path>: <message>`` otherwise.

    Attributes:
        code: a :class:`ErrorCode`.
        path: the file the error is about ("" when none).
        offset: the absolute file offset it is about, or None.
    """

    def __init__(self, message, code, path="", offset=None):
        super().__init__(message)
        try:
            self.code = ErrorCode(code)
        except ValueError:  # a code newer than this package: keep the number
            self.code = code
        self.path = path
        self.offset = offset

    def __reduce__(self):  # picklable, e.g. across multiprocessing
        return (type(self), (str(self), int(self.code), self.path, self.offset))


# Named as users meet them (tsar.Error, tsar.ErrorCode): a traceback prints
# "tsar.Error: ...", not the private module that defines them.
Error.__module__ = ErrorCode.__module__ = "tsar"
