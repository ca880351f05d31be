"""Errors a user can cause with their data; messages are one line naming the file and row."""


class DatasetError(ValueError):
    """Bad dataset input (missing file, bad row, empty dataset, overlong prompt)."""
