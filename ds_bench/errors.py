"""The one exception type for bad user input.

A ``UserError`` carries a single line that names the file, line, key or flag at fault and what is
expected. The CLI turns it into that line on stderr (``say``) and exit code 2, with no traceback,
before anything is written to the results file.
"""

import sys


class UserError(Exception):
    """Bad input from the user: config, flags, data paths, hostfiles, environment."""

    exit_code = 2


def say(line: str) -> None:
    """Write ``line`` and its newline to stderr in one ``write``: ranks that share a launcher's stderr pipe each
    print the same error, and ``print`` writes the text and the newline apart, so two ranks' lines ran together
    (``...tokens)ds-bench: error: ...``). One write of under ``PIPE_BUF`` bytes is atomic on a pipe; through
    ``sys.stderr`` (line-buffered: flushed whole at the newline), so what captures it still does."""
    sys.stderr.write(line.rstrip("\n") + "\n")
    sys.stderr.flush()
