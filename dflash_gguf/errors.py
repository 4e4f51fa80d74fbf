"""Every error the package raises for a reason the user can fix, in one place.

The command line (dflash_gguf/cli.py) prints each as one line, `error: <message>`, and exits with
its `exit_code`: 2 for every class here. The message names the file or option, the field and the fix.

    DflashError          the base: catch it to catch them all
    OptionError          options that do not go together, or an option's value out of its range
      OptionErrors       several such problems found at once (a command's settings, dflash_gguf/settings.py):
                         the command line prints each on a line of its own
      ServerArgsError    llama-server arguments after `--` that the runner manages, or malformed
    InputError           an input (a file, a prompt) cannot be read as one: missing, not a regular
                         file, too large, empty
    OutsideFolderError   a file of a model or release folder is a link that leads out of it
    HubError             a model named on the Hub cannot be read: gated, missing, unreachable, or
                         not in the cache when offline
    OutputError          an output that may not be written: it would replace an input, exists
                         without --force, or its folder is missing
    MissingExtraError    a command needs an optional dependency group that is not installed
    CheckpointError      the drafter checkpoint (config.json, safetensors) is unusable
    TargetError          the target (GGUF or HF folder) is unusable or does not fit the drafter
    GGUFFormatError      a GGUF file is truncated, corrupt or not what was expected
    LlamaBuildError      fetching, patching or building llama.cpp failed
    ServerError          llama-server could not be started, stopped responding, or answered an error
      ServerStartError   ... exited or never became ready during start-up (its log is quoted)
    QuantizeError        a quantization cannot be made as asked: unknown type or recipe, an input
                         already quantized, llama-quantize missing, failing, or writing other
                         tensors than the recipe says
    LicenseError         the license terms forbid, or do not say enough to allow, what was asked
    ReleaseError         a release folder cannot be built: bad name, types or destination, or a
                         variant that fails its validation
    PublishError         a release folder cannot be published: not one `release` wrote, or the
                         Hub refused the commit (the token never appears in the message)

Interrupts are not errors: they exit 128+N (dflash_gguf/signals.py).
"""


class DflashError(Exception):
    """Bad input the user can fix: the message names the file, the field and the fix."""

    exit_code = 2


class OptionError(DflashError):
    """Options that do not go together, or an option's value out of its range."""


class OptionErrors(OptionError):
    """Every problem a command's settings have, found in one check: one line each."""

    def __init__(self, problems):
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class ServerArgsError(OptionError):
    """llama-server arguments after `--` that the runner manages itself, or that are malformed."""


class InputError(DflashError):
    """An input (a file, a prompt) cannot be read as one."""


class OutsideFolderError(DflashError):
    """A file of a folder is a link that leads out of it."""


class HubError(DflashError):
    """A model named on the Hub cannot be read; the message names the repository and what to do."""


class OutputError(DflashError):
    """An output may not be written where it was asked."""


class MissingExtraError(DflashError):
    """A command needs an optional dependency group that is not installed."""


class CheckpointError(DflashError):
    """The drafter checkpoint (config.json, safetensors) is unusable."""


class TargetError(DflashError):
    """The target (GGUF or HF folder) is unusable or does not fit the drafter."""


class GGUFFormatError(DflashError):
    """A GGUF file is truncated, corrupt or not what was expected."""


class LlamaBuildError(DflashError):
    """Fetching, patching or building llama.cpp failed."""


class ServerError(DflashError):
    """llama-server could not be started, stopped responding, or answered with an error."""


class ServerStartError(ServerError):
    """llama-server exited or did not become ready during start-up; the message quotes its log."""

    def __init__(self, message: str, returncode: int | None = None, log_path=None):
        super().__init__(message)
        self.returncode = returncode
        self.log_path = log_path


class QuantizeError(DflashError):
    """A quantization cannot be made as asked, or llama-quantize did not write what the recipe says."""


class LicenseError(DflashError):
    """The license terms forbid, or do not say enough to allow, what was asked."""


class ReleaseError(DflashError):
    """A release folder cannot be built as asked."""


class PublishError(DflashError):
    """A release folder cannot be published, or the Hub refused it."""
