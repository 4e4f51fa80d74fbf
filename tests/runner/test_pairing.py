"""Drafter pairing: `serve -t` without `-d` finds a drafter that fits and says why the others do not;
and the check it applies is llama-server's: a tap of the target's last layer is refused everywhere."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import GGUFValueType

from dflash_gguf.gguf.format import KV
from dflash_gguf.gguf.keys import DFlash
from tests.conftest import LLAMA_BACKEND, REPO, cli
from training.fixtures.gguf_edit import edited_copy
from tests.refusal import assert_refused

SHA = "0123456789abcdef0123456789abcdef01234567"


def _taps(src: Path, dst: Path, llama_ids: list[int]) -> Path:
    return edited_copy(src, dst, set_kv=(KV(DFlash.TARGET_LAYERS, GGUFValueType.ARRAY, llama_ids,
                                            GGUFValueType.INT32),))


def _wide(src: Path, dst: Path) -> Path:
    """The drafter as if made for a target of another width (its hidden size 128, the target's 64)."""
    return edited_copy(src, dst, set_kv=(KV(DFlash.EMBEDDING_LENGTH, GGUFValueType.UINT32, 128),))


# --- the check: llama-server's ----------------------------------------------------------------

def test_inspect_refuses_a_tap_of_the_targets_last_layer(converted, target_gguf, tmp_path):
    # the tiny target is a 6-layer qwen3, whose graph records layers 1..5: HF id 5 (llama.cpp 6) is not
    last = _taps(converted["dflash-swa"], tmp_path / "dflash-last.gguf", [2, 6])
    assert cli("inspect", last).returncode == 0  # alone, nothing is wrong with the file
    proc = cli("inspect", last, "--target", target_gguf)
    assert_refused(proc, "dflash-last.gguf", "target_layer_ids [5]", "tap layer 6", "qwen3 graph",
                   "provides layers 1..5", "within 0..4")
    inside = _taps(converted["dflash-swa"], tmp_path / "dflash-inside.gguf", [2, 5])
    fits = cli("inspect", inside, "--target", target_gguf, "--json")
    assert fits.returncode == 0, fits.stderr
    assert json.loads(fits.stdout)["target"]["fits"] is True


def test_convert_refuses_a_tap_of_the_targets_last_layer(drafter_copy, target_gguf, tmp_path):
    folder = drafter_copy("dflash-swa")
    config = json.loads((folder / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [1, 5]
    (folder / "config.json").write_text(json.dumps(config))
    proc = cli("convert", folder, "--target", target_gguf, "-o", tmp_path / "out.gguf")
    assert_refused(proc, "target_layer_ids [5]", "tap layer 6", "provides layers 1..5")
    assert not (tmp_path / "out.gguf").exists()


# --- serve without -d ---------------------------------------------------------------------------

def _serve(*args: str | Path, hf_home: Path) -> tuple[str, list[str]]:
    """Run `serve` until it is ready; its stderr and llama-server's command line once it has stopped."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", "serve", *map(str, args), "--backend",
                             LLAMA_BACKEND, "--", "-c", "512", "-t", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.communicate(timeout=60)[1]
        children = subprocess.run(["pgrep", "-P", str(proc.pid), "llama-server"], capture_output=True,
                                  text=True).stdout.split()
        (child,) = children
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().decode().split("\0")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        return err, cmdline
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def release_folder(converted, target_gguf, tmp_path) -> Path:
    """A target with a sidecar drafter of its own and one made for a wider target, as a release lays them out."""
    folder = tmp_path / "release"
    folder.mkdir()
    shutil.copyfile(target_gguf, folder / "tiny-F16.gguf")
    shutil.copyfile(converted["dflash-b16"], folder / "dflash-tiny-F16.gguf")
    _wide(converted["dflash-b16"], folder / "dflash-wide-F16.gguf")
    return folder


@pytest.mark.integration
def test_serve_uses_the_drafter_beside_the_target_and_skips_another_width(release_folder, tmp_path):
    err, cmdline = _serve("-t", release_folder / "tiny-F16.gguf", hf_home=tmp_path / "hf")
    used = release_folder / "dflash-tiny-F16.gguf"
    assert f"drafter: {used} (beside the target)" in err
    wide = [line for line in err.splitlines() if line.startswith(f"skipped drafter {release_folder / 'dflash-wide-F16.gguf'}")]
    assert len(wide) == 1 and "hidden size 128 != target embedding length 64" in wide[0], err
    assert cmdline[cmdline.index("-md") + 1] == str(used)


@pytest.mark.integration
def test_no_draft_serves_the_target_alone(release_folder, tmp_path):
    err, cmdline = _serve("-t", release_folder / "tiny-F16.gguf", "--no-draft", hf_home=tmp_path / "hf")
    assert "-md" not in cmdline and "drafter" not in err.replace("the target alone", "")
    assert "the target alone" in err


@pytest.mark.integration
def test_no_drafter_that_fits_serves_the_target_alone_and_says_so(release_folder, tmp_path):
    (release_folder / "dflash-tiny-F16.gguf").unlink()
    err, cmdline = _serve("-t", release_folder / "tiny-F16.gguf", hf_home=tmp_path / "hf")
    assert "-md" not in cmdline
    assert "hidden size 128" in err and "no drafter for tiny-F16.gguf (none of them fits" in err


@pytest.mark.integration
def test_a_drafter_in_the_hugging_face_cache_that_names_the_target(converted, target_gguf, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copyfile(target_gguf, folder / "tiny-Q8_0.gguf")
    snapshot = tmp_path / "hf" / "hub" / "models--someone--tiny-DFlash-GGUF" / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    shutil.copyfile(converted["dflash-b16"], snapshot / "dflash-tiny-F16.gguf")
    shutil.copyfile(converted["dflash-b16"], snapshot / "dflash-other-model-F16.gguf")  # names another model
    err, cmdline = _serve("-t", folder / "tiny-Q8_0.gguf", hf_home=tmp_path / "hf")
    assert f"drafter: {snapshot / 'dflash-tiny-F16.gguf'} (in the Hugging Face cache (someone/tiny-DFlash-GGUF))" in err
    assert "dflash-other-model" not in err
    assert cmdline[cmdline.index("-md") + 1] == str(snapshot / "dflash-tiny-F16.gguf")


def test_no_draft_and_draft_together_are_refused(converted, target_gguf):
    proc = cli("serve", "-t", target_gguf, "-d", converted["dflash-b16"], "--no-draft")
    assert_refused(proc, "--no-draft", "--draft")
