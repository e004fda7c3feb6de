"""The one exception type for bad user input.

A ``UserError`` carries a single line that names the file, line, key or flag at fault and what is
expected. The CLI turns it into that line on stderr and exit code 2, with no traceback, before
anything is written to the results file.
"""


class UserError(Exception):
    """Bad input from the user: config, flags, data paths, hostfiles, environment."""

    exit_code = 2
