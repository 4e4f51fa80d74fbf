"""Typed errors. The command line turns each into one line on stderr and exit status 2."""


class DflashError(Exception):
    """Bad input the user can fix: the message names the file, the field and the fix."""

    exit_code = 2


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
