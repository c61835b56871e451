"""pb's runners, given pb's part of the command line instead of reading ``sys.argv``.

pb reads its experiment options (``--experiment_name``, ``--config_*``, config overrides)
in one place: every YamlReader that ``BaseRunner.setup_yaml_reader`` makes parses
``sys.argv`` (argparse without an argument list), and pb's runners make one whenever they
start or resume an experiment. The launcher parses its command line once and gives pb's
part to the runners it builds (``pb_argv``); ``sys.argv`` is that command line only while
a YamlReader parses it.
"""

import contextlib
import sys

from powerful_benchmarker.runners import single_experiment_runner


@contextlib.contextmanager
def command_line(argv):
    """``sys.argv`` is ``[program, *argv]`` inside the block."""
    saved = sys.argv
    sys.argv = [saved[0] if saved else "pml-fieldlosses-pb", *argv]
    try:
        yield
    finally:
        sys.argv = saved


class GivenCommandLine:
    """For a pb runner class: its YamlReaders parse ``self.pb_argv``."""

    pb_argv = ()

    def setup_yaml_reader(self):
        # pb's YamlReader parses sys.argv (its argparse parse_known_args() gets no list), and
        # nothing else of pb, ax or record-keeper reads it: the swap covers this call only
        with command_line(self.pb_argv):
            return super().setup_yaml_reader()


class SingleExperimentRunner(GivenCommandLine, single_experiment_runner.SingleExperimentRunner):
    """pb's SingleExperimentRunner with its command line given."""

    def __init__(self, pb_argv=(), **kwargs):
        super().__init__(**kwargs)
        self.pb_argv = list(pb_argv)
