"""What the wire carries (issue 49): secrets in every form a server can echo them in, bytes no header
can carry, and the environment's switches read as huggingface_hub reads them, against the local Hub
(tests/local_hub.py) through the real command line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from tests.local_hub import Blob, LocalHub, hub_env, raw
from tests.refusal import assert_refused
from tests.warm import run_cli

# Not shaped like an hf_ token (the filter's pattern would mask that whatever it knows), and holding
# what URL encoding rewrites
SECRET = "Wire+Secret/0123456789=abcdef"
ECHOES = {
    "as sent": lambda sent: sent,
    "quote": lambda sent: quote(sent, safe=""),
    "quote_plus": quote_plus,
    "path quote": quote,
}
# HF_TOKEN as a user may set it: huggingface_hub sends it stripped, CR/LF removed
AS_SET = f"  {SECRET}\r\n"


def _sent(handler) -> str:
    return handler.headers.get("Authorization", "").removeprefix("Bearer ")


def _file_echoing(hub: LocalHub, repo_id: str, make):
    """Answer a file of `repo_id` whose content `make(token as sent)` returns, as the Hub answers one."""
    def fn(handler) -> None:
        blob = Blob(make(_sent(handler)).encode())
        handler._file(blob, {"X-Repo-Commit": hub.store[repo_id].refs["main"], "ETag": f'"{blob.git_oid}"'})
    return fn


def _leaked(text: str) -> bool:
    return any(echo(SECRET) in text for echo in ECHOES.values())


def _run(hub, tmp_path, *args, **env):
    return run_cli(args, env=hub_env(hub, tmp_path, **{"DFLASH_GGUF_HUB_TIMEOUT": "5", **env}), timeout=120)


# -- secrets in every form the wire carries them -------------------------------------------------------

@pytest.mark.parametrize("echo", sorted(ECHOES))
def test_a_token_echoed_as_sent_into_an_error_never_shows(hub, fixtures, target_gguf, tmp_path, echo):
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")

    def fn(handler) -> None:
        message = f"token {ECHOES[echo](_sent(handler))} is not valid here"
        handler._reply(400, json.dumps({"error": message}).encode(), {"X-Error-Message": message})

    hub.answer(r"/api/models/z-lab/tiny-dflash(/revision/.*)?", fn)
    out = tmp_path / "o.gguf"
    proc = _run(hub, tmp_path, "-v", "convert", "z-lab/tiny-dflash", "-t", target_gguf, "-o", out, HF_TOKEN=AS_SET)
    assert any(c["headers"].get("authorization") == f"Bearer {SECRET}" for c in hub.calls), "nothing echoed"
    assert proc.returncode == 2, proc.stderr
    assert "***" in proc.stderr and not _leaked(proc.stdout + proc.stderr), proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("echo", ["as sent", "quote"])
def test_a_token_echoed_into_a_target_s_chat_template_is_not_written(hub, fixtures, tmp_path, echo):
    config = json.loads((fixtures / "target-hf" / "tokenizer_config.json").read_text())

    def template(sent: str) -> str:
        return json.dumps({**config, "chat_template": "{{ messages }} " + ECHOES[echo](sent)})

    target = tmp_path / "target-hf"
    shutil.copytree(fixtures / "target-hf", target)
    (target / "tokenizer_config.json").write_text(template(SECRET))  # the listing's sizes match the echo
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    hub.add_folder("Qwen/tiny-target", target)
    hub.answer(r"/Qwen/tiny-target/resolve/[^/]+/tokenizer_config.json", _file_echoing(hub, "Qwen/tiny-target", template))
    out = tmp_path / "o.gguf"
    proc = _run(hub, tmp_path, "convert", "z-lab/tiny-dflash", "-t", "Qwen/tiny-target", "-o", out, HF_TOKEN=AS_SET)
    assert any(c["path"].endswith("tokenizer_config.json") and c["method"] == "GET" for c in hub.calls), proc.stderr
    assert_refused(proc, "would carry the Hugging Face token", out=out)
    assert not _leaked(proc.stdout + proc.stderr)
    assert not any(_leaked(p.read_bytes().decode("latin-1")) for p in tmp_path.rglob("*.gguf"))


def test_publish_never_prints_a_commit_url_echoing_the_token(hub, tmp_path):
    from tests.release.test_publish import _folder

    folder = _folder(tmp_path / "rel")

    def commit(handler) -> None:
        sent = quote(_sent(handler), safe="")
        handler._json(200, {"commitUrl": f"{hub.url}/me/tiny/commit/{'1' * 40}?by={sent}",
                            "commitOid": "1" * 40, "success": True})

    hub.answer(r"/api/models/me/tiny/commit/main", commit)
    proc = _run(hub, tmp_path, "publish", folder, "--repo", "me/tiny", HF_TOKEN=AS_SET)
    assert any(c["path"].endswith("/commit/main") for c in hub.calls), proc.stderr
    assert not _leaked(proc.stdout + proc.stderr), proc.stdout + proc.stderr


@pytest.mark.parametrize("where, env, needle", [
    ("HF_TOKEN", {"HF_TOKEN": " abcde\n"}, "HF_TOKEN: the token is 5 characters"),
    ("token file", {}, "token file"),
    ("HF_TOKEN", {"HF_TOKEN": "Wire-Secr\u00e9t-0123456789"}, "HF_TOKEN: the token holds a character outside"),
])
def test_a_token_the_filter_or_a_header_cannot_hold_is_refused_before_any_request(hub, fixtures, tmp_path, where,
                                                                                   env, needle):
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    if where == "token file":
        (tmp_path / "hf-home").mkdir()
        (tmp_path / "hf-home" / "token").write_text("abcde\n")
    out = tmp_path / "o.gguf"
    proc = _run(hub, tmp_path, "convert", "z-lab/tiny-dflash", "-t", "z-lab/tiny-dflash", "-o", out, **env)
    assert_refused(proc, needle, out=out)
    assert "abcde" not in proc.stderr
    assert hub.calls == []


def test_a_short_endpoint_credential_is_refused_before_any_request(hub, tmp_path):
    endpoint = hub.url.replace("http://", "http://me:pw12@")
    proc = _run(hub, tmp_path, "convert", "z-lab/tiny-dflash", "-t", "z-lab/t", "-o", tmp_path / "o.gguf",
                HF_ENDPOINT=endpoint)
    assert_refused(proc, "HF_ENDPOINT's credential")
    assert "pw12" not in proc.stderr and hub.calls == []


@pytest.mark.parametrize("minted", [False, True], ids=["HF_OIDC_ID_TOKEN", "GitHub-minted"])
def test_the_oidc_exchange_is_guarded_and_its_token_filtered(hub, fixtures, target_gguf, tmp_path, minted):
    """The access token the exchange answers is known to the filter before anything can print it."""
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    access = "oidc-access-0123456789abcdef"
    hub.answer(r"/oauth/token", raw(200, json.dumps({"access_token": access, "expires_in": 3600}).encode()))

    def fn(handler) -> None:
        message = f"token {quote(_sent(handler), safe='')} is not valid here"
        handler._reply(400, json.dumps({"error": message}).encode(), {"X-Error-Message": message})

    hub.answer(r"/api/models/z-lab/tiny-dflash(/revision/.*)?", fn)
    id_token = "ci-id-token-0123456789abcdef"
    minting = "gh-request-token-0123456789"
    hub.answer(r"/gh/id-token", raw(200, json.dumps({"value": id_token}).encode()))
    ci = {"GITHUB_ACTIONS": "true", "ACTIONS_ID_TOKEN_REQUEST_URL": f"{hub.cdn_url}/gh/id-token",
          "ACTIONS_ID_TOKEN_REQUEST_TOKEN": minting} if minted else {"HF_OIDC_ID_TOKEN": id_token}
    proc = _run(hub, tmp_path, "convert", "z-lab/tiny-dflash", "-t", target_gguf, "-o", tmp_path / "o.gguf",
                HF_OIDC_RESOURCE="z-lab/tiny-dflash", **ci)
    (exchange,) = [c for c in hub.calls if c["path"] == "/oauth/token"]
    assert not exchange["cdn"] and json.loads(exchange["body"])["subject_token"] == id_token, proc.stderr
    if minted:  # GitHub's own bearer token to GitHub's URL, and there only
        (mint,) = [c for c in hub.calls if c["path"] == "/gh/id-token"]
        assert mint["headers"].get("authorization") == f"Bearer {minting}"
        assert not any(minting in c["headers"].get("authorization", "") for c in hub.calls if not c["cdn"])
    assert any(c["headers"].get("authorization") == f"Bearer {access}" for c in hub.calls), proc.stderr
    assert_refused(proc, "HTTP 400")
    for secret in (access, id_token, minting):
        assert secret not in proc.stdout + proc.stderr, proc.stderr


def test_the_oidc_exchange_is_never_redirected_to_another_host(hub, tmp_path):
    id_token = "ci-id-token-0123456789abcdef"
    hub.answer(r"/oauth/token", raw(307, b"", {"Location": f"{hub.cdn_url}/oauth/token"}))
    proc = _run(hub, tmp_path, "convert", "z-lab/tiny-dflash", "-t", "z-lab/t", "-o", tmp_path / "o.gguf",
                HF_OIDC_RESOURCE="z-lab/tiny-dflash", HF_OIDC_ID_TOKEN=id_token)
    assert_refused(proc, "redirects this POST", "another host")
    assert not any(c["cdn"] for c in hub.calls), "the id token was re-posted to another host"


# -- bytes no header can carry ---------------------------------------------------------------------------

def test_a_non_ascii_user_agent_origin_is_refused_by_name(hub, tmp_path):
    proc = _run(hub, tmp_path, "convert", "z-lab/d", "-t", "z-lab/t", "-o", tmp_path / "o.gguf",
                HF_HUB_USER_AGENT_ORIGIN="caf\u00e9-ci")
    assert_refused(proc, "HF_HUB_USER_AGENT_ORIGIN")
    assert hub.calls == []


def test_a_non_ascii_endpoint_path_is_refused_by_name(hub, tmp_path):
    proc = _run(hub, tmp_path, "convert", "z-lab/d", "-t", "z-lab/t", "-o", tmp_path / "o.gguf",
                HF_ENDPOINT=f"{hub.url}/mirr\u00f6r")
    assert_refused(proc, "HF_ENDPOINT", "outside ASCII")
    assert hub.calls == []


def test_a_response_header_with_a_byte_above_0x7f_is_refused_by_name(hub, fixtures, target_gguf, tmp_path):
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    sha = hub.store["z-lab/tiny-dflash"].refs["main"]
    config = (fixtures / "dflash-b16" / "config.json").read_bytes()
    hub.answer(r"/z-lab/tiny-dflash/resolve/[^/]+/config.json",
               raw(200, config, {"X-Repo-Commit": sha, "ETag": '"' + "e" * 40 + '"', "X-Served-By": "caf\u00e9"}))
    out = tmp_path / "o.gguf"
    proc = _run(hub, tmp_path, "convert", "z-lab/tiny-dflash", "-t", target_gguf, "-o", out)
    assert_refused(proc, "X-Served-By header", "0x7f", out=out)


@pytest.mark.parametrize("command", ["validate", "tune", "bench"])
def test_a_prompt_holding_a_lone_surrogate_is_refused_with_its_line(target_gguf, tmp_path, command):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"prompt": "a\\ud800b"}\n')
    proc = run_cli([command, "-t", target_gguf, "-d", target_gguf, "--prompts", prompts], timeout=60)
    assert_refused(proc, f"{prompts}:2", "lone surrogate")


# -- the environment's switches, as huggingface_hub reads them --------------------------------------------

@pytest.mark.parametrize("name, value", [("HF_HUB_OFFLINE", "1 "), ("HF_HUB_OFFLINE", "maybe"),
                                         ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "y"), ("TRANSFORMERS_OFFLINE", "on\n")])
def test_a_switch_neither_true_nor_false_is_refused_before_any_request(hub, fixtures, tmp_path, name, value):
    """huggingface_hub takes anything but 1/ON/YES/TRUE as false: "1 " would mean online, silently."""
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    proc = _run(hub, tmp_path, "convert", "z-lab/tiny-dflash", "-t", "z-lab/tiny-dflash", "-o", tmp_path / "o.gguf",
                **{name: value})
    assert_refused(proc, name)
    assert hub.calls == []


@pytest.mark.parametrize("value", ["1", "yes", "On", "TRUE"])
def test_every_spelling_huggingface_hub_takes_as_true_is_offline(hub, fixtures, tmp_path, value):
    hub.add_folder("z-lab/tiny-dflash", fixtures / "dflash-b16")
    proc = _run(hub, tmp_path, "convert", "z-lab/tiny-dflash", "-t", "z-lab/tiny-dflash", "-o", tmp_path / "o.gguf",
                HF_HUB_OFFLINE=value)
    assert_refused(proc, "HF_HUB_OFFLINE=1 forbids fetching")
    assert hub.calls == []


def test_a_library_warning_is_one_scrubbed_line(hub, tmp_path):
    proc = _run(hub, tmp_path, "convert", "z-lab/d", "-t", "z-lab/t", "-o", tmp_path / "o.gguf",
                HF_HUB_ENABLE_HF_TRANSFER="1", HF_HUB_OFFLINE="1")
    warning, error = proc.stderr.strip().splitlines()
    assert warning.startswith("warning: FutureWarning: The `HF_HUB_ENABLE_HF_TRANSFER`"), proc.stderr
    assert error.startswith("error: ") and "warnings.warn" not in proc.stderr, proc.stderr
