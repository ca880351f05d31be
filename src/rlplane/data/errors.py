"""Errors a user can cause with their data; messages are one line naming the file and row."""

import os
import stat


class DatasetError(ValueError):
    """Bad dataset input (missing file, bad row, empty dataset, overlong prompt)."""


def unreadable(path: str) -> str | None:
    """Why ``path`` cannot be read as a data file (no such file, a directory, a FIFO or device, closed to this user),
    or None when it can. A directory on the way that this user may not enter reads as closed, not as missing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot reach it ({e.strerror or type(e).__name__})"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a FIFO or a device: reading it could wait or never end)"
    if not os.access(path, os.R_OK):
        return "cannot read it (Permission denied)"
    return None
