"""Errors that the command line reports as one line, without a traceback."""


class UserError(Exception):
    """A problem with the user's input (file, row, option) that the user can fix."""
