"""The click parameter type for a model argument: a local path, or a Hub repo id (resolve.py)."""

from __future__ import annotations

import click

from . import resolve as hub

HELP_FORMS = "a local path, or on the Hub owner/name[@revision]"
HELP_GGUF_FORMS = "owner/name[@revision]:QUANT or owner/name[@revision]/path/file.gguf"


class ModelParam(click.ParamType):
    """A path that exists (it always wins), else a Hub repo id; converts to a Path or a hub.HubRef.
    Nothing is fetched here: the command resolves it, so Hub errors are its one-line errors."""

    name = "model"

    def __init__(self, folder_ok: bool = True, file_ok: bool = True, hub_gguf_ok: bool = True):
        self.folder_ok, self.file_ok, self.hub_gguf_ok = folder_ok, file_ok, hub_gguf_ok

    def convert(self, value, param, ctx):
        if isinstance(value, hub.HubRef):
            return value
        model = hub.as_model(value)
        if isinstance(model, hub.HubRef):
            if model.is_gguf and not self.hub_gguf_ok:
                self.fail(f"{value}: names a GGUF file on the Hub; give the repository as owner/name[@revision]",
                          param, ctx)
            if not model.is_gguf and not self.folder_ok:
                self.fail(f"{value}: names a repository; name its GGUF as {HELP_GGUF_FORMS}", param, ctx)
            return model
        if not model.exists():
            self.fail(f"{value}: no such file or folder, and not a Hub repo id ({HELP_FORMS})", param, ctx)
        if model.is_dir() and not self.folder_ok:
            self.fail(f"{value}: is a folder; give a file", param, ctx)
        if not model.is_dir() and not self.file_ok:
            self.fail(f"{value}: is a file; give a folder ({HELP_FORMS})", param, ctx)
        return model
