"""A HermeticError crosses a process pool whole: its class, message, hint and every attribute, an OSError's errno
and filename too (HermeticError.__reduce__), whatever its constructor's arguments."""

import errno
import pickle

from hermetic.core.errors import HermeticError, MissingExtra, disk_full
from hermetic.hostfs.filesystems import NotWritable


def _round_trip(e):
    return pickle.loads(pickle.dumps(e))


def test_disk_full_keeps_errno_filename_and_size():
    e = _round_trip(disk_full(OSError(errno.EDQUOT, "quota"), "/store/blob", needed=2048))
    assert type(e).__name__ == "DiskFull" and isinstance(e, OSError)
    assert (e.errno, e.filename, e.needed, e.exit_code) == (errno.EDQUOT, "/store/blob", 2048, 73)
    assert str(e) == "/store/blob: disk quota exceeded (2.0 kB needed)" and e.hint


def test_not_writable_keeps_errno_and_filename():
    e = _round_trip(NotWritable("/cache: read-only", hint="make it writable", errno=errno.EROFS, filename="/cache"))
    assert isinstance(e, NotWritable) and isinstance(e, OSError)
    assert (e.errno, e.filename, e.hint, str(e), e.exit_code) == (errno.EROFS, "/cache", "make it writable",
                                                                 "/cache: read-only", 73)


def test_an_error_with_its_own_constructor_and_exit_code():
    e = _round_trip(MissingExtra("plots", "plots", "matplotlib"))
    assert isinstance(e, MissingExtra) and e.extra == "plots" and e.exit_code == 69
    assert str(e) == "plots needs matplotlib, which is not installed: pip install 'hermetic[plots]'"
    e = _round_trip(HermeticError("worker", exit_code=71, details=["one"]))
    assert (str(e), e.exit_code, e.details) == ("worker", 71, ["one"])
