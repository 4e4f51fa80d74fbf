"""The program's own state files read as untrusted input: the stored token file, tuned records,
build.json and the release card `doctor` reads. None is opened blocking (a FIFO is refused, not
waited on), none is read past a bound (a sparse 5 GiB file, /dev/zero, deep JSON), and no value from
one reaches a llama-server command line before it is typed and ranged."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from dflash_gguf.errors import LlamaBuildError
from dflash_gguf.runner import build
from dflash_gguf.runner import tuned_settings as tuned
from dflash_gguf.runner.serve_cli import _tuned
from dflash_gguf.runner.tune import Setting
from dflash_gguf.validation.doctor import card_tau
from tests.warm import run_cli

HOSTILE_FILES = ["fifo", "dev-zero", "sparse-5GiB", "deep-json"]


def _make(path: Path, kind: str) -> None:
    """A hostile state file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "sparse-5GiB":
        with open(path, "wb") as fh:
            fh.truncate(5 << 30)
    elif kind == "deep-json":
        path.write_text("[" * 200_000 + "]" * 200_000)


def _within(seconds: float, call):
    """call(), which must end within `seconds` (a read blocked on a FIFO would not): its result or error."""
    box: dict = {}

    def run():
        try:
            box["result"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            box["error"] = err

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still reading after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("result")


# -- the stored token file --------------------------------------------------------------------------------

def _cli(*args: str, hf_home: Path, token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    env["HF_HOME"] = str(hf_home)
    if token:
        env["HF_TOKEN"] = token
    return run_cli(args, env=env, timeout=60)


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_a_command_that_sends_no_token_never_reads_the_token_file(tmp_path: Path, kind: str):
    _make(tmp_path / "hf" / "token", kind)
    proc = _cli("--version", hf_home=tmp_path / "hf")
    assert proc.returncode == 0 and proc.stdout.startswith("dflash-gguf, version"), proc.stderr
    assert proc.stderr == ""


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_a_command_that_needs_the_token_refuses_a_hostile_token_file_in_one_line(tmp_path: Path, kind: str):
    from tests.release.test_publish import _folder

    _make(tmp_path / "hf" / "token", kind)
    proc = _cli("publish", str(_folder(tmp_path / "rel")), "--repo", "me/tiny", hf_home=tmp_path / "hf")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert str(tmp_path / "hf" / "token") in proc.stderr and "HF_TOKEN" in proc.stderr


def test_hf_token_set_leaves_the_token_file_unread(tmp_path: Path):
    from tests.release.test_publish import _folder

    _make(tmp_path / "hf" / "token", "fifo")
    proc = _cli("publish", str(_folder(tmp_path / "rel")), "--repo", "me/tiny", "--dry-run",
                hf_home=tmp_path / "hf", token="hf_EnvironmentToken0123456789abcdefXYZ")
    assert proc.returncode == 0, proc.stderr


def test_an_artifact_holding_the_stored_login_is_not_sent(tmp_path: Path):
    from tests.release.test_publish import _folder

    token = "stored-login-secret-0123456789"
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text(token + "\n")
    folder = _folder(tmp_path / "rel", extra={"LICENSE": f"text {token}\n"})
    proc = _cli("publish", str(folder), "--repo", "me/tiny", "--dry-run", hf_home=tmp_path / "hf")
    assert proc.returncode == 2 and "holds the Hugging Face token" in proc.stderr, proc.stderr
    assert token not in proc.stdout + proc.stderr


# -- tuned records ------------------------------------------------------------------------------------------

@pytest.fixture
def key(tmp_path: Path, monkeypatch) -> tuned.TuneKey:
    monkeypatch.setenv("DFLASH_GGUF_TUNED", str(tmp_path / "tuned"))
    (tmp_path / "t.gguf").write_bytes(b"target" * 100)
    (tmp_path / "d.gguf").write_bytes(b"drafter" * 100)
    return tuned.TuneKey.of(tmp_path / "t.gguf", tmp_path / "d.gguf", "71e8d1dc00673b20")


def _record(**chosen) -> dict:
    setting = {**Setting(True, 1, 4, 0.5).to_dict(), **chosen}
    return {"chosen": setting, "drafting_pays": True, "speedup": 1.5,
            "best_drafting": {"label": "drafter -t 1 n_max 4", "tau": 3.2, "pairs": 18},
            "settings": {"min_speedup": 1.05}, "finished_at": "2026-12-01T00:00:00Z"}


@pytest.mark.parametrize("field, value", [
    ("drafting", "false"),             # bool("false") is True: -md would be passed
    ("threads", 1_000_000_000_000),
    ("threads", -5),
    ("threads", 2.5),
    ("draft_max", "4; rm -rf"),
    ("p_min", float("nan")),           # json writes NaN, and Python's json reads it back
    ("p_min", 7.0),
])
def test_a_tampered_tuned_value_is_ignored_with_one_warning_never_passed_on(key, capsys, field, value):
    path = tuned.save(key, _record())
    record = json.loads(path.read_text())
    record["chosen"][field] = value
    path.write_text(json.dumps(record))
    with pytest.raises(tuned.UnreadableTuning, match=rf"{path}: field 'chosen\.{field}'"):
        tuned.load(key)
    assert _tuned(key, Path("t.gguf"), None, ()) is None  # serve: nothing taken from it
    err = capsys.readouterr().err
    assert err.startswith("warning: ignoring the tuned setting") and err.count("\n") == 1, err
    assert f"chosen.{field}" in err and str(path) in err


@pytest.mark.parametrize("where, value", [
    (("speedup",), "fast"), (("settings", "min_speedup"), None), (("best_drafting", "label"), "\x1b[2Jok"),
    (("best_drafting", "pairs"), "many"), (("finished_at",), ["a"]),
])
def test_every_value_serve_prints_from_a_record_is_typed(key, where, value):
    record = _record()
    holder = record
    for part in where[:-1]:
        holder = holder[part]
    holder[where[-1]] = value
    path = tuned.save(key, record)
    with pytest.raises(tuned.UnreadableTuning, match=str(path)):
        tuned.load(key)


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_a_hostile_tuned_file_is_refused_without_blocking_or_reading_it_whole(key, kind):
    _make(key.path(), kind)
    with pytest.raises(tuned.UnreadableTuning, match=str(key.path())):
        _within(20, lambda: tuned.load(key))


def test_a_sound_record_still_applies(key):
    tuned.save(key, _record())
    applied = tuned.apply(tuned.load(key), None, ())
    assert applied.server_args == ("-t", "1", "--spec-draft-p-min", "0.5") and applied.draft_max == 4


# -- build.json ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [
    HOSTILE_FILES[0], HOSTILE_FILES[1], HOSTILE_FILES[2], HOSTILE_FILES[3],
    '{"key": ["a"]}', '{"key": "../../x"}', '{"backend": 5}', '{"cmake_flags": "-DX"}', '"a string"', "{",
])
def test_a_tampered_build_json_is_one_line_naming_it(tmp_path: Path, content: str):
    manifest = tmp_path / "k" / "build.json"
    (tmp_path / "k" / "bin").mkdir(parents=True)
    if content in HOSTILE_FILES:
        _make(manifest, content)
    else:
        manifest.write_text(content)
    with pytest.raises(LlamaBuildError) as caught:
        _within(20, lambda: build.build_info(tmp_path / "k" / "bin", "cpu"))
    message = str(caught.value)
    assert str(manifest) in message and "llama build --rebuild" in message and "\n" not in message


def test_a_sound_build_json_is_read(tmp_path: Path):
    (tmp_path / "k" / "bin").mkdir(parents=True)
    (tmp_path / "k" / "build.json").write_text(json.dumps({"key": "71e8d1dc00673b20", "backend": "cpu",
                                                           "cmake_flags": ["-DGGML_NATIVE=OFF"]}))
    assert build.build_info(tmp_path / "k" / "bin", None)["build"] == "71e8d1dc00673b20"


# -- the card doctor reads ----------------------------------------------------------------------------------

def _card(folder: Path, tau: str) -> Path:
    draft = folder / "dflash-T-Q8_0.gguf"
    draft.write_bytes(b"GGUF")
    (folder / "README.md").write_text("| File | Size | τ | Speedup |\n|---|---|---|---|\n"
                                      f"| [{draft.name}](./{draft.name}) | 1 MB | {tau} | 1.2x |\n")
    return draft


@pytest.mark.parametrize("cell, tau", [
    ("3.41", 3.41), ("14.5 (validated)", 14.5), ("1.2.3", None), ("nan", None), ("1e999", None), ("inf", None),
    ("-", None), ("0", None), ("٣", None), ("9" * 400, None),
])
def test_a_card_tau_that_is_not_a_number_is_no_tau(tmp_path: Path, cell: str, tau):
    assert card_tau(_card(tmp_path, cell)) == tau


@pytest.mark.parametrize("kind", ["fifo", "sparse-5GiB", "dev-zero"])
def test_a_hostile_card_beside_the_drafter_is_refused_unread(tmp_path: Path, kind: str):
    from dflash_gguf.errors import DflashError

    draft = tmp_path / "dflash-T-Q8_0.gguf"
    draft.write_bytes(b"GGUF")
    _make(tmp_path / "README.md", kind)
    with pytest.raises(DflashError, match="README.md"):  # a link to /dev/zero leads out of the folder
        _within(20, lambda: card_tau(draft))


@pytest.mark.parametrize("content", ["fifo", "sparse-5GiB", "deep-json", '{"flags": 5}', '["a"]', "{"])
def test_a_configure_stamp_that_is_not_one_means_configuring_anew(tmp_path: Path, content: str):
    stamp = tmp_path / ".dflash-configure.json"
    if content in HOSTILE_FILES:
        _make(stamp, content)
    else:
        stamp.write_text(content)
    assert _within(20, lambda: build._configured(stamp)) is None
    stamp.unlink()
    wanted = {"flags": ["-DA=1"], "generator": [], "source": "/s"}
    stamp.write_text(json.dumps(wanted))
    assert build._configured(stamp) == wanted and build.reconfigurable(build._configured(stamp), wanted)
