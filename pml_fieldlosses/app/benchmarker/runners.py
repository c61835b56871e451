"""pb's runners, given pb's part of the command line instead of reading ``sys.argv``.

pb reads its experiment options (``--experiment_name``, ``--config_*``, config overrides)
in one place: every YamlReader that ``BaseRunner.setup_yaml_reader`` makes parses
``sys.argv`` (argparse without an argument list), and pb's runners make one whenever they
start or resume an experiment. The launcher parses its command line once and gives pb's
part to the runners it builds (``pb_argv``); ``sys.argv`` is that command line only while
a YamlReader parses it.

A mistake in pb's part (a missing ``--experiment_name``, an unbalanced bracket, a value
that is not YAML) is a UsageError, one line, instead of argparse's usage and exit or pb's
ValueError traceback; a class name no module has is ``names.UnknownClass``, named.
"""

import argparse
import contextlib
import os
import re
import sys

import yaml
from powerful_benchmarker.runners import single_experiment_runner

from ..errors import UsageError
from .files import describe_yaml_error
from .names import NamedGetter

# an option glued to its value in one word: "--x=1", "--x {a: 1}"
GLUED_OPTION = re.compile(r"^(--[A-Za-z][^\s=]*)(?:=|\s+)(.*)$", re.DOTALL)
# a word that pb takes for an option (easy_module_attribute_getter's YamlReader)
OPTION = re.compile(r"^--[a-zA-Z]")


def pb_words(pb_argv):
    """pb's part of the command line as pb reads it: the words a shell gives for it
    unquoted. pb joins the words of a ``{...}`` or ``[...]`` value again, but refuses a
    colon inside a word ("There must be a space after the colon") and an option glued to
    its value: an option glued to its value ('--x=1', '--x {a: 1}' quoted as one word) is
    split from it, and a quoted ``{...}``/``[...]`` config value is split at its blanks
    (not the value of pb's own options, e.g. a ``--experiment_name``)."""
    words = []
    for word in pb_argv:
        glued = GLUED_OPTION.match(word)
        if glued:
            words.append(glued[1])
            word = glued[2]
        own_value = bool(words) and words[-1][2:] in PB_OPTIONS
        if word[:1] in ("{", "[") and not own_value:
            words += word.split() or [word]
        else:
            words.append(word)
    return words


def check_values(words):
    """The config values of pb's part of the command line (``words``, see ``pb_words``) as
    pb's YamlReader takes them, each mistake named by its option: a word before any option,
    a colon inside a word, unbalanced brackets, a value that is not YAML. (pb refuses the
    first three without naming the option, and the last with a traceback.)"""
    option, value = None, []
    for word in [*words, "--"]:
        if OPTION.match(word) is None and word != "--":
            if option is None:
                raise UsageError(f"{word!r} follows no option: pb's options are written --name value")
            value.append(word)
            continue
        if option is not None and option[2:] not in PB_OPTIONS and value:
            check_value(option, value)
        option, value = word, []


def check_value(option, words):
    """One option's value, as the shell split it into ``words``."""
    text = " ".join(words)
    where = f"argument {option}: {text!r}"
    if any(re.search(":.", word, re.DOTALL) for word in words):
        raise UsageError(f"{where}: put a space after each colon, e.g. {{key: value}} (pb's rule)")
    for opener, closer in ("{}", "[]", "()"):
        if text.count(opener) != text.count(closer):
            raise UsageError(f"{where}: unbalanced {opener} {closer}")
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageError(f"{where} is not YAML ({describe_yaml_error(e)})") from None


def experiment_name(text):
    """An argparse type: ``--experiment_name``, one folder name (pb makes
    ``<root_experiment_folder>/<name>``; '' or '..' would be the root or above it)."""
    if text in ("", ".", "..") or "/" in text or "\0" in text or (os.altsep and os.altsep in text):
        raise argparse.ArgumentTypeError(
            f"expected a folder name (no '/', not '' or '.' or '..'), got {text!r}"
        )
    return text


class PbArgumentParser(argparse.ArgumentParser):
    """argparse with a mistake raised as a UsageError (the launcher prints one line)."""

    def error(self, message):
        raise UsageError(message)


# pb 0.9.33's own experiment options (BaseRunner.setup_argparser): the rest of pb's part
# of the command line sets config keys
PB_OPTIONS = {
    "experiment_name": {"type": experiment_name, "required": True},
    "resume_training": {"type": str, "default": None, "choices": ["latest", "best"]},
    "evaluate": {"action": "store_true"},
    "evaluate_ensemble": {"action": "store_true"},
    "reproduce_results": {"type": str, "default": None},
}


def pb_argument_parser():
    """pb's own experiment options (PB_OPTIONS), checked."""
    parser = PbArgumentParser(prog="pml-fieldlosses-pb", allow_abbrev=False, add_help=False)
    for name, settings in PB_OPTIONS.items():
        parser.add_argument(f"--{name}", **settings)
    return parser


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
    """For a pb runner class: its YamlReaders parse ``self.pb_argv``, its mistakes are
    UsageErrors, and its class lookup names a class it cannot find (names.NamedGetter)."""

    pb_argv = ()

    def init_pytorch_getter(self):
        super().init_pytorch_getter()
        self.pytorch_getter = NamedGetter.like(self.pytorch_getter)

    def setup_argparser(self):
        return pb_argument_parser()

    def setup_yaml_reader(self):
        # pb's YamlReader parses sys.argv (its argparse parse_known_args() gets no list), and
        # nothing else of pb, ax or record-keeper reads it: the swap covers this call only
        with command_line(self.pb_argv):
            try:
                return super().setup_yaml_reader()
            except UsageError:
                raise
            except ValueError as e:  # pb's check of the words: brackets, colons, a value without option
                lines = "; ".join(line for line in str(e).splitlines() if line)
                raise UsageError(
                    f"{lines} (pb reads a value as the shell splits it, e.g. --x~APPLY~2 {{a: 1}})"
                )
            except yaml.YAMLError as e:
                raise UsageError(
                    f"a value of the command line is not YAML: {' '.join(str(e).split())}"
                ) from None


class SingleExperimentRunner(GivenCommandLine, single_experiment_runner.SingleExperimentRunner):
    """pb's SingleExperimentRunner with its command line given."""

    def __init__(self, pb_argv=(), **kwargs):
        super().__init__(**kwargs)
        self.pb_argv = list(pb_argv)
