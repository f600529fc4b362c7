"""Running the gpushare command in-process, as the CLI tests do."""

import pytest

from jupyter_gpushare.cli import main


def run(capsys, *argv):
    """Exit status, stdout and stderr of a command that returns."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *argv):
    """Exit status and stderr of a command that argparse refuses."""
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    return e.value.code, capsys.readouterr().err
