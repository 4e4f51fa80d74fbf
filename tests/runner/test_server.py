"""llama-server ownership (`LlamaServer`), the speculative flags, and `serve` / `generate`.

Unit tests use a fake `llama-server` (a small Python HTTP server) to prove start-up errors, time-outs
and reaping without llama.cpp; the `integration` tests run the real patched build on the tiny
fixtures (random weights: acceptance is about 0, drafting itself is what is checked).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dflash_gguf.errors import DflashError
from dflash_gguf.runner.client import LlamaClient, Metrics
from dflash_gguf.runner.launch import dflash_server, read_draft, speculative_args
from dflash_gguf.runner.server import LlamaServer, ServerStartError, error_line
from tests.conftest import LLAMA_BACKEND, REPO, cli, dflash_gguf
from tests.refusal import assert_refused
from tests.malformed import edit_config, regenerate_weights

# the build the integration tests run; a GPU machine sets DFLASH_TEST_BACKEND=cuda
BACKEND = LLAMA_BACKEND
SMALL = ["-c", "512"]  # keep the KV cache of the tiny target small


# ---------------------------------------------------------------------------------------------
# helpers and fixtures
# ---------------------------------------------------------------------------------------------

def pid_alive(pid: int) -> bool:
    """A live process (a zombie, i.e. exited but not reaped, counts as alive: nobody reaped it)."""
    return Path(f"/proc/{pid}").exists()


def llama_servers_using(needle: str | Path) -> list[int]:
    """pids of llama-server processes whose command line mentions `needle` (a /proc scan)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"llama-server") and str(needle).encode() in b" ".join(cmdline):
            found.append(int(entry.name))
    return found


def children_named(ppid: int, name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if comm == name and int(fields[1]) == ppid:
            found.append(int(entry.name))
    return found


def convert(fixtures: Path, drafter: str | Path, target: Path, out: Path) -> Path:
    src = drafter if isinstance(drafter, Path) else fixtures / drafter
    proc = dflash_gguf("convert", src, "--target", target, "-o", out)
    assert proc.returncode == 0, proc.stderr
    return out


def _misfit(fixtures: Path, folder: Path, target_changes: dict, drafter_changes: dict, regenerate: bool) -> Path:
    """A drafter converted for a made-up target that shares the tiny target's tokenizer but not
    its geometry, i.e. a drafter "made for another target" (the converter accepts it, against that
    target)."""
    drafter = folder / "drafter"
    shutil.copytree(fixtures / "dflash-b16", drafter)
    edit_config(drafter, **drafter_changes)
    if regenerate:
        regenerate_weights(drafter)
    target = folder / "target"
    target.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(fixtures / "target-hf" / name, target / name)
    edit_config(target, **target_changes)
    return convert(fixtures, drafter, target, folder / "dflash-misfit.gguf")


@pytest.fixture(scope="session")
def misfits(fixtures: Path, tmp_path_factory) -> dict[str, Path]:
    """Drafters that do not fit the tiny target (hidden 64, 6 layers)."""
    return {
        # hidden size 128 against the target's 64
        "hidden": _misfit(fixtures, tmp_path_factory.mktemp("misfit-hidden"),
                          {"hidden_size": 128}, {"hidden_size": 128}, regenerate=True),
        # taps layer 9 (llama.cpp 10) of a 6-layer target
        "layers": _misfit(fixtures, tmp_path_factory.mktemp("misfit-layers"),
                          {"num_hidden_layers": 12}, {"dflash__target_layer_ids": [0, 2, 9],
                                                      "num_target_layers": 12}, regenerate=False),
    }


# ---------------------------------------------------------------------------------------------
# unit: flags from metadata, metrics text, log reading
# ---------------------------------------------------------------------------------------------

def test_speculative_args_follow_the_drafters_block_size(converted: dict[str, Path]):
    b16 = converted["dflash-b16"]
    assert speculative_args(b16) == ["-md", str(b16), "--spec-type", "draft-dflash", "--spec-draft-n-max", "15"]
    b8 = converted["dflash2-b8"]
    assert speculative_args(b8)[-1] == "7"
    assert speculative_args(b16, draft_max=4)[-1] == "4"
    assert speculative_args(b16, draft_max=99)[-1] == "15"  # llama.cpp would clamp it anyway
    info = read_draft(b16)
    assert (info.block_size, info.facts().hidden, info.facts().target_layer_ids) == (16, 64, (0, 2, 4))


def test_speculative_args_refuse_what_is_not_a_drafter(target_gguf: Path):
    with pytest.raises(DflashError, match="not a DFlash drafter"):
        speculative_args(target_gguf)


METRICS_TEXT = """\
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 105
llamacpp:spec_decode_num_accepted_tokens_total 42
llamacpp:spec_decode_num_drafts_total 14
llamacpp:predicted_tokens_seconds 26.9322
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 12
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 3
"""


def test_metrics_parse_the_prometheus_text():
    m = Metrics.from_text(METRICS_TEXT)
    assert (m.draft_tokens, m.accepted_tokens, m.drafts) == (105, 42, 14)
    assert m.acceptance == pytest.approx(0.4)
    assert m.mean_accepted_length == pytest.approx(4.0)
    assert m.accepted_per_position == [12, 0, 3]
    assert m.get("predicted_tokens_seconds") == pytest.approx(26.9322)
    earlier = Metrics.from_text(METRICS_TEXT.replace(" 105", " 100").replace(" 42", " 40"))
    delta = m.since(earlier)
    assert (delta.draft_tokens, delta.accepted_tokens, delta.drafts) == (5, 2, 0)
    assert delta.mean_accepted_length is None


def test_error_line_prefers_the_reason_to_noise():
    log = [
        "0.00.507.248 E llama_init_from_model: failed to initialize the context: dflash requires ctx_other "
        "to be set (this warning is normal during memory fitting)",
        "0.00.986.035 E dflash: draft embedding length 128 != target 64 (drafter d.gguf does not fit this target)",
        "0.00.986.096 E srv    load_model: failed to create MTP context",
        "0.00.987.949 E srv  llama_server: exiting due to model loading error",
    ]
    assert error_line(log) == "dflash: draft embedding length 128 != target 64 (drafter d.gguf does not fit this target)"
    crash = ["0.01.0 I loading", "#6  0x00007f in llama_model_dflash::graph<false>::graph() from libllama.so",
             "/src/ggml.c:2273: GGML_ASSERT(ggml_can_repeat(b, a)) failed"]
    assert error_line(crash) == "/src/ggml.c:2273: GGML_ASSERT(ggml_can_repeat(b, a)) failed"


# ---------------------------------------------------------------------------------------------
# unit: the process life cycle, on a fake llama-server
# ---------------------------------------------------------------------------------------------

FAKE_SERVER = textwrap.dedent('''\
    import http.server, json, os, signal, sys, time
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    mode = os.environ.get("FAKE_MODE", "ok")
    open(os.environ["FAKE_PIDFILE"], "w").write(str(os.getpid()))
    print("0.00.001.000 I srv  llama_server: loading model", flush=True)
    if mode == "fail":
        print("0.00.002.000 E llama_init_from_model: failed to initialize the context: dflash requires ctx_other", flush=True)
        print("0.00.003.000 E dflash: draft vocabulary size 1000 != target 151936", flush=True)
        sys.exit(1)
    if mode == "abort":
        print("ggml.c:1: GGML_ASSERT(lid <= model.hparams.n_layer()) failed", flush=True)
        os.kill(os.getpid(), signal.SIGABRT)
    if mode == "hang":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:  # as llama-server does: SIGTERM is a clean shutdown
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "ok"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    ''')


@pytest.fixture
def fake(tmp_path: Path):
    """fake(mode) -> (LlamaServer kwargs, pid file): a fake llama-server that behaves per `mode`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "llama-server"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_SERVER)
    exe.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")

    def make(mode: str, **kwargs):
        pidfile = tmp_path / f"{mode}.pid"
        env = {**os.environ, "FAKE_MODE": mode, "FAKE_PIDFILE": str(pidfile)}
        kwargs.setdefault("log_path", tmp_path / f"{mode}.log")
        return LlamaServer(model, bin_dir=bin_dir, env=env, **kwargs), pidfile

    return make


def test_start_failure_quotes_the_error_line(fake):
    server, _ = fake("fail")
    with pytest.raises(ServerStartError) as err:
        with server:
            pass
    assert err.value.returncode == 1
    assert "exited with status 1" in str(err.value)
    assert "dflash: draft vocabulary size 1000 != target 151936" in str(err.value)
    assert str(server.log_path) in str(err.value) and server.log_path.is_file()


def test_start_crash_is_named(fake):
    server, _ = fake("abort")
    with pytest.raises(ServerStartError, match=r"crashed \(SIGABRT\).*GGML_ASSERT\(lid <= model"):
        server.start()


def test_start_timeout_quotes_the_log_and_kills_the_server(fake):
    server, pidfile = fake("hang", startup_timeout=1.5, stop_grace=0.5)
    with pytest.raises(ServerStartError, match=r"did not become ready within 1.5 s; last log lines: .*loading model"):
        server.start()
    assert not pid_alive(int(pidfile.read_text()))


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_a_server_that_ignores_sigterm_is_killed(fake, exc):
    server, pidfile = fake("stubborn", stop_grace=0.5)
    with pytest.raises(exc):
        with server:
            assert server.client.health()
            pid = server.pid
            raise exc("boom")
    assert int(pidfile.read_text()) == pid
    assert not pid_alive(pid)


def test_clean_stop_returns_the_exit_status_and_removes_its_temporary_log(fake):
    server, _ = fake("ok", log_path=None)
    server.start()
    assert LlamaClient(server.client.url).health()
    pid, log = server.pid, server.log_path
    assert log.is_file() and "loading model" in log.read_text()
    assert server.stop() == 0
    assert server.pid is None and not pid_alive(pid)
    assert not log.exists()


# ---------------------------------------------------------------------------------------------
# the pre-check: refused before anything starts (no llama.cpp needed)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, needles", [
    ("hidden", ["hidden size 128", "embedding length 64"]),
    ("layers", ["target_layer_ids [9]", "6 layers"]),
])
def test_serve_refuses_a_drafter_made_for_another_target(target_gguf: Path, misfits: dict[str, Path],
                                                         kind: str, needles: list[str]):
    proc = dflash_gguf("serve", "--target", target_gguf, "--draft", misfits[kind], "--backend", BACKEND)
    assert_refused(proc, *needles)
    assert proc.stdout == ""
    assert llama_servers_using(misfits[kind]) == []


@pytest.mark.parametrize("command, args, needle", [
    ("serve", ["--", "-m", "other.gguf"], "-m after --: the target is --target"),
    ("serve", ["--", "--model-draft", "d.gguf"], "--model-draft after --: the drafter is --draft"),
    ("validate", ["--", "--spec-type", "draft-mtp"], "--spec-type after --: the runner sets it"),
    ("validate", ["--parallel", "2", "--", "-np", "4"], "--parallel is 2 but 4 after --; give it once"),
    ("serve", ["--port", "8080", "--", "--port", "9090"], "--port is 8080 but 9090 after --; give it once"),
    ("serve", ["--", "--port", "http"], "--port 'http' after --: expected a whole number"),
    ("generate", ["hello", "--", "--host", "127.0.0.1,::1"], "one TCP address"),
    ("serve", ["--", "--ssl-key-file", "k.pem"], "plain HTTP"),
])
def test_server_args_the_runner_manages_are_refused_at_once(target_gguf: Path, converted: dict[str, Path],
                                                            command: str, args: list[str], needle: str):
    draft = converted["dflash-b16"]
    proc = cli(command, "--target", target_gguf, "--draft", draft, "--backend", BACKEND, *args)
    assert_refused(proc)
    assert needle in proc.stderr and proc.stdout == ""
    assert llama_servers_using(draft) == []


@pytest.mark.parametrize("command, args", [
    ("serve", ["--", "-sm", "tensor"]),
    ("validate", ["--", "--split-mode=tensor"]),
    ("tune", ["--quick", "--", "-ngl", "0", "--split-mode", "TENSOR"]),
])
def test_tensor_split_with_a_dflash2_drafter_is_refused_with_the_workaround(
        target_gguf: Path, converted: dict[str, Path], command: str, args: list[str]):
    """llama.cpp aborts on it (GGML_ASSERT(src_ss[0].axis != GGML_BACKEND_SPLIT_AXIS_0), #27819)."""
    draft = converted["dflash2-b8"]
    proc = cli(command, "--target", target_gguf, "--draft", draft, "--backend", BACKEND, *args)
    assert_refused(proc)
    assert "--split-mode tensor with a DFlash 2 drafter" in proc.stderr and "#27819" in proc.stderr
    assert "use --split-mode layer" in proc.stderr and proc.stdout == ""
    assert llama_servers_using(draft) == []


def test_tensor_split_is_left_alone_for_dflash_and_other_modes(target_gguf: Path, converted: dict[str, Path]):
    from dflash_gguf.runner.launch import launch_recipe

    launch = launch_recipe(target_gguf, converted["dflash-b16"], server_args=["-sm", "tensor"])
    assert launch.user_args == ("-sm", "tensor")
    launch = launch_recipe(target_gguf, converted["dflash2-b8"], server_args=["--split-mode", "layer"])
    assert launch.user_args == ("--split-mode", "layer")


def test_server_args_honoured_are_taken_out_and_the_rest_kept_in_order(tmp_path: Path):
    from dflash_gguf.runner.launch import CTX_SIZE, parse_server_args

    keys = tmp_path / "keys.txt"
    keys.write_text("# our keys\nk1\nk2\n")
    given = parse_server_args(["-c", "512", "--port=8091", "-ctkd", "q8_0", "--host", "0.0.0.0", "-np", "3",
                               "--spec-draft-n-max", "4", "--api-key-file", str(keys), "-c", "2048"])
    assert given.honoured == {"port": 8091, "host": "0.0.0.0", "parallel": 3, "draft_max": 4}
    assert given.passthrough == ("-c", "512", "-ctkd", "q8_0", "--api-key-file", str(keys), "-c", "2048")
    assert given.api_key == "k1" and given.value_of(CTX_SIZE) == "2048"  # llama.cpp takes the last
    assert parse_server_args(["--api-key", "a,b"]).api_key == "a"


def test_a_tree_budget_after_the_dashes_goes_to_the_drafting_server_only(target_gguf: Path,
                                                                         converted: dict[str, Path]):
    from dflash_gguf.runner.launch import launch_recipe

    launch = launch_recipe(target_gguf, converted["dflash2-b8"], server_args=["--spec-tree-budget", "16", "-c", "512"])
    assert launch.tree_budget == 16 and launch.user_args == ("-c", "512")
    assert launch.args()[launch.args().index("--spec-tree-budget") + 1] == "16"
    assert "--spec-tree-budget" not in launch.alone().args()  # llama-server refuses a tree without a drafter
    assert "--spec-tree-budget" not in launch_recipe(target_gguf, converted["dflash2-b8"]).args()
    # its floor too (patch 0017): with the tree, never on the target alone's command line
    launch = launch_recipe(target_gguf, converted["dflash2-b8"],
                           server_args=["--spec-tree-p-min=0.1", "--spec-tree-budget", "16", "-c", "512"])
    assert launch.tree_p_min == 0.1 and launch.user_args == ("-c", "512")
    assert launch.args()[launch.args().index("--spec-tree-p-min") + 1] == "0.1"
    assert "--spec-tree-p-min" not in launch.alone().args()


@pytest.mark.parametrize("args, draft, needle", [
    (["--spec-tree-budget", "-1"], True, "--spec-tree-budget '-1' after --: expected a whole number, 0..255"),
    (["--spec-tree-budget=many"], True, "--spec-tree-budget 'many' after --: expected a whole number"),
    (["--spec-tree-budget", "300"], True, "0..255"),
    (["--spec-tree-budget", "8", "--spec-draft-n-max", "auto"], True, "with --draft-max auto"),
    (["--spec-tree-budget", "8"], False, "a draft tree needs a drafter"),
    (["--spec-tree-budget", "8", "--spec-tree-p-min", "1"], True,
     "--spec-tree-p-min '1' after --: expected a probability, at least 0 and below 1"),
    (["--spec-tree-budget", "8", "--spec-tree-p-min", "nan"], True, "expected a probability"),
    (["--spec-tree-p-min", "0.2"], True, "--spec-tree-p-min after -- without --spec-tree-budget N"),
])
def test_a_tree_budget_llama_server_would_refuse_is_refused_first(target_gguf: Path, converted: dict[str, Path],
                                                                 args: list[str], draft: bool, needle: str):
    from dflash_gguf.errors import ServerArgsError
    from dflash_gguf.runner.launch import launch_recipe

    with pytest.raises(ServerArgsError, match=re.escape(needle)):
        launch_recipe(target_gguf, converted["dflash2-b8"] if draft else None, server_args=args)


def test_rpc_servers_from_the_option_or_after_the_dashes_go_into_the_launch(target_gguf: Path,
                                                                           converted: dict[str, Path]):
    from dflash_gguf.runner.launch import launch_recipe, with_rpc

    args = with_rpc("127.0.0.1:50052, 10.0.0.2:50053", ["-c", "512"])
    assert args == ("--rpc", "127.0.0.1:50052,10.0.0.2:50053", "-c", "512")
    launch = launch_recipe(target_gguf, converted["dflash-b16"], server_args=args)
    assert launch.rpc == ("127.0.0.1:50052", "10.0.0.2:50053") and launch.user_args == ("-c", "512")
    assert launch.args()[launch.args().index("--rpc") + 1] == "127.0.0.1:50052,10.0.0.2:50053"
    assert "--rpc" in launch.summary()["recipe"] and "--rpc" in launch.alone().args()  # the target alone too
    assert with_rpc("h:1", ["--rpc", "h:1"]) == ("--rpc", "h:1", "--rpc", "h:1")  # the same twice is fine


@pytest.mark.parametrize("command, args, needle", [
    ("serve", ["--rpc", "localhost"], "'localhost' is not HOST:PORT"),
    ("validate", ["--", "--rpc", "h:1,h:99999"], "--rpc after -- 'h:1,h:99999': 'h:99999' is not HOST:PORT"),
    ("serve", ["--rpc", "a:1", "--", "--rpc=b:2"], "--rpc is a:1 but b:2 after --; give it once"),
    ("doctor", ["--rpc", ":50052"], "':50052' is not HOST:PORT"),
    # an rpc-server serves one llama-server at a time (ggml-rpc.cpp's accept loop)
    ("tune", ["--rpc", "127.0.0.1:50052"], "tune runs two llama-servers side by side"),
    ("bench", ["--", "--rpc", "127.0.0.1:50052"], "bench runs two llama-servers side by side"),
    # the drafter borrows the target's output layer, on an RPC server: llama.cpp aborts
    ("serve", ["--rpc", "127.0.0.1:50052", "--", "-devd", "none"], "-devd none with --rpc: the drafter uses"),
    ("validate", ["--", "--rpc=h:1", "--spec-draft-device=none"], "leave -devd out"),
])
def test_bad_rpc_addresses_are_refused_at_once(target_gguf: Path, converted: dict[str, Path], command: str,
                                               args: list[str], needle: str):
    draft = converted["dflash-b16"]
    proc = cli(command, "--target", target_gguf, "--draft", draft, "--backend", BACKEND, *args)
    assert_refused(proc, needle)
    assert proc.stdout == ""


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_arguments_the_runner_manages_are_refused_before_the_target_is_looked_for(monkeypatch, command: str):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a fetch would be refused with a line of its own
    extra = ["-d", REPO / "pyproject.toml", "Hello"] if command == "generate" else []
    proc = cli(command, "-t", "someorg/somemodel:Q4_K_M", *extra, "--", "-m", "x.gguf")
    assert_refused(proc, "-m after --: the target is --target")
    assert proc.stdout == ""


def test_generate_needs_a_url_or_a_pair(target_gguf: Path):
    assert_refused(cli("generate", "--target", target_gguf, "hello"), "--url")


# ---------------------------------------------------------------------------------------------
# integration: the real patched llama-server
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(llama_bin: Path, target_gguf: Path, converted: dict[str, Path]):
    with dflash_server(target_gguf, converted["dflash-b16"], bin_dir=llama_bin, server_args=SMALL) as s:
        yield s


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            return proc.stdout.readline().strip()
        if proc.poll() is not None:
            break
    raise AssertionError(f"serve printed no URL (exit {proc.poll()}): {proc.stderr.read() if proc.poll() is not None else ''}")


@pytest.mark.integration
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_serve_drafts_and_leaves_no_process(llama_bin: Path, target_gguf: Path, converted: dict[str, Path],
                                            stop_signal: signal.Signals):
    draft = converted["dflash-b16"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_gguf.cli", "serve", "--target", str(target_gguf), "--draft", str(draft),
         "--backend", BACKEND, "--", *SMALL],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        url = _read_line(proc, 120)
        assert url.startswith("http://127.0.0.1:")
        (child,) = children_named(proc.pid, "llama-server")
        answer = LlamaClient(url).complete("The capital of France is", n_predict=16)
        assert answer.n_predicted == len(answer.tokens) > 0
        assert answer.draft_n > 0, answer.timings  # the drafter drafted
        assert 0 <= answer.draft_n_accepted <= answer.draft_n
        assert LlamaClient(url).metrics().draft_tokens == answer.draft_n
        proc.send_signal(stop_signal)
        assert proc.wait(60) == 0, proc.stderr.read()
        assert "stopped llama-server" in proc.stderr.read()
        assert not pid_alive(child)
        assert llama_servers_using(draft) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.integration
def test_serve_honours_a_port_given_after_the_dashes(target_gguf: Path, converted: dict[str, Path]):
    """`serve -- --port N`: the server listens on N and the runner polls N (it used to poll a port
    of its own and wait out the whole start-up timeout)."""
    from dflash_gguf.runner.server import free_port

    port = free_port()
    draft = converted["dflash-b16"]
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_gguf.cli", "serve", "--target", str(target_gguf), "--draft", str(draft),
         "--backend", BACKEND, "--startup-timeout", "100", "--", *SMALL, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert _read_line(proc, 90) == f"http://127.0.0.1:{port}"
        assert time.monotonic() - started < 90
        (child,) = children_named(proc.pid, "llama-server")
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        assert cmdline.count(b"--port") == 1 and cmdline[cmdline.index(b"--port") + 1] == str(port).encode()
        assert LlamaClient(f"http://127.0.0.1:{port}").health()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.integration
def test_an_api_key_after_the_dashes_is_sent_by_the_runner(target_gguf: Path, converted: dict[str, Path]):
    proc = dflash_gguf("generate", "-t", target_gguf, "-d", converted["dflash-b16"], "--backend", BACKEND,
                       "-n", "4", "--json", "Hello", "--", *SMALL, "--api-key", "s3cret")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["results"][0]["n_predicted"] == 4 and report["metrics"] is not None
    assert "--api-key" in report["server"]["args"]
    with pytest.raises(DflashError, match="HTTP 401"):  # the key is really required by that server
        with dflash_server(target_gguf, converted["dflash-b16"], backend=BACKEND,
                           server_args=[*SMALL, "--api-key", "s3cret"]) as s:
            LlamaClient(s.client.url).complete("Hello", n_predict=1)


@pytest.mark.integration
def test_warnings_are_said_once(drafter_copy, target_gguf: Path, tmp_path: Path):
    """A pair warning (mask token = padding token) is printed once by convert and once by generate."""
    drafter = edit_config(drafter_copy("dflash-b16"), dflash__mask_token_id=151643)
    out = tmp_path / "pad-mask.gguf"
    proc = dflash_gguf("convert", drafter, "--target", target_gguf, "-o", out)
    assert proc.returncode == 0 and proc.stderr.count("padding token") == 1, proc.stderr
    proc = dflash_gguf("generate", "-t", target_gguf, "-d", out, "--backend", BACKEND, "-n", "2", "Hi", "--", *SMALL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("padding token") == 1 and proc.stderr.startswith("warning: "), proc.stderr


@pytest.mark.integration
def test_generate_json_starts_and_stops_its_own_server(llama_bin: Path, target_gguf: Path,
                                                        converted: dict[str, Path]):
    draft = converted["dflash2-b8"]
    proc = dflash_gguf("generate", "--target", target_gguf, "--draft", draft, "--backend", BACKEND,
                       "-n", "12", "--json", "The capital of France is", "def fibonacci(n):", "--", "-c", "512")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["url"].startswith("http://127.0.0.1:")
    assert report["server"]["draft"] == str(draft)
    assert [r["prompt"] for r in report["results"]] == ["The capital of France is", "def fibonacci(n):"]
    for r in report["results"]:
        assert set(r) >= {"content", "tokens", "n_prompt", "n_predicted", "stop_type", "draft_n",
                          "draft_n_accepted", "acceptance", "tokens_per_second"}
        assert isinstance(r["content"], str) and r["n_predicted"] == len(r["tokens"]) > 0
        assert r["draft_n"] > 0 and 0 <= r["draft_n_accepted"] <= r["draft_n"]
        assert r["acceptance"] == pytest.approx(r["draft_n_accepted"] / r["draft_n"])
    assert report["draft_n"] == sum(r["draft_n"] for r in report["results"])
    m = report["metrics"]  # the server's own counters agree with the per-request timings
    assert m["draft_tokens"] == report["draft_n"] and m["accepted_tokens"] == report["draft_n_accepted"]
    assert m["drafts"] > 0 and len(m["accepted_per_position"]) == 7  # block 8: drafts of up to 7
    assert llama_servers_using(draft) == []


@pytest.mark.integration
def test_generate_against_a_running_server(server: LlamaServer):
    proc = dflash_gguf("generate", "--url", server.client.url, "-n", "8", "Hello")
    assert proc.returncode == 0, proc.stderr
    answer = server.client.complete("Hello", n_predict=8)  # greedy: the same text again
    assert proc.stdout == answer.content + "\n"
    assert "drafted" in proc.stderr and "accepted" in proc.stderr


@pytest.mark.integration
def test_client_tokens_and_metrics(server: LlamaServer):
    server = server.client
    ids = server.tokenize("Hello world!")
    assert ids == [9707, 1879, 0]  # Qwen3's ids
    assert server.detokenize(ids) == "Hello world!"
    before = server.metrics()
    by_text = server.complete("Hello world!", n_predict=8, cache_prompt=False)
    by_ids = server.complete(ids, n_predict=8, cache_prompt=False, n_probs=2)
    assert by_ids.tokens == by_text.tokens and len(by_text.tokens) == by_text.n_predicted
    assert by_ids.probs and by_ids.probs[0]["top_logprobs"][0]["id"] == by_ids.tokens[0]
    delta = server.metrics().since(before)
    assert delta.draft_tokens == by_text.draft_n + by_ids.draft_n > 0


@pytest.mark.integration
@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_context_manager_reaps_the_server_on_an_exception(llama_bin: Path, target_gguf: Path,
                                                          converted: dict[str, Path], exc):
    with pytest.raises(exc):
        with dflash_server(target_gguf, converted["dflash-b16"], bin_dir=llama_bin, server_args=SMALL) as s:
            pid = s.pid
            assert s.client.health()
            raise exc("boom")
    assert not pid_alive(pid)


@pytest.mark.integration
@pytest.mark.parametrize("kind, reason", [
    ("hidden", "dflash: draft embedding length 128 != target 64"),
    ("layers", "dflash: draft target layer 10"),
])
def test_patched_server_refuses_a_misfit_drafter_cleanly(llama_bin: Path, target_gguf: Path,
                                                         misfits: dict[str, Path], tmp_path: Path,
                                                         kind: str, reason: str):
    """Bypass our pre-check: the patched llama-server itself must refuse, exit 1, no core dump
    (unpatched it aborts: GGML_ASSERT(ggml_can_repeat) / GGML_ASSERT(lid <= n_layer), SIGABRT)."""
    draft = misfits[kind]
    server = LlamaServer(target_gguf, [*speculative_args(draft), *SMALL], bin_dir=llama_bin,
                         log_path=tmp_path / "server.log", startup_timeout=120)
    with pytest.raises(ServerStartError) as err:
        server.start()
    assert err.value.returncode == 1, str(err.value)  # not -6 / 134 (SIGABRT)
    assert reason in str(err.value)
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert "GGML_ASSERT" not in log and "core dumped" not in log
    assert llama_servers_using(draft) == []


def test_exact_launches_with_the_reference_kernels_and_warns_on_a_build_without_them(
        target_gguf: Path, converted: dict[str, Path], llama_bin: Path, tmp_path: Path, caplog):
    """--exact: --no-repack plus GGML_CPU_USE_REF=1 in the server's environment (patch 0007); a
    build whose CPU library does not read the variable (a stock one) gets a warning, once."""
    from dflash_gguf.runner import launch as launch_module
    from dflash_gguf.runner.build import has_reference_kernels

    exact = launch_module.launch_recipe(target_gguf, converted["dflash-b16"], exact=True)
    server = exact.server(bin_dir=llama_bin)
    assert "--no-repack" in server.args and server.env["GGML_CPU_USE_REF"] == "1"
    assert has_reference_kernels(llama_bin)
    plain = launch_module.launch_recipe(target_gguf, converted["dflash-b16"]).server(bin_dir=llama_bin)
    assert "--no-repack" not in plain.args and plain.env.get("GGML_CPU_USE_REF") == os.environ.get("GGML_CPU_USE_REF")

    stock = tmp_path / "bin"  # llama-server and a CPU library that never names the variable
    stock.mkdir()
    (stock / "llama-server").write_bytes((llama_bin / "llama-server").read_bytes())
    (stock / "libggml-cpu.so").write_bytes(b"\x7fELF a CPU backend without the switch")
    assert not has_reference_kernels(stock)
    launch_module._check_reference_kernels.cache_clear()
    with caplog.at_level("WARNING"):
        exact.server(bin_dir=stock)
        exact.server(bin_dir=stock)
    warned = [r.getMessage() for r in caplog.records if "GGML_CPU_USE_REF" in r.getMessage()]
    assert len(warned) == 1 and str(stock) in warned[0] and "patch 0007" in warned[0]


def test_exact_reaches_the_rpc_servers_or_warns(target_gguf: Path, converted: dict[str, Path], llama_bin: Path):
    """An rpc-server computes the head's layers itself: `llama rpc-server --exact` gives it the
    reference kernels, and a head launched with --exact and --rpc says so."""
    from dflash_gguf.runner.launch import launch_recipe
    from dflash_gguf.runner.rpc import RpcServer

    assert RpcServer(bin_dir=llama_bin, exact=True).env["GGML_CPU_USE_REF"] == "1"
    assert RpcServer(bin_dir=llama_bin).env.get("GGML_CPU_USE_REF") == os.environ.get("GGML_CPU_USE_REF")
    warned = launch_recipe(target_gguf, converted["dflash-b16"], exact=True, rpc=["127.0.0.1:50052"]).warnings
    assert any("llama rpc-server --exact" in w for w in warned), warned
    assert not launch_recipe(target_gguf, converted["dflash-b16"], rpc=["127.0.0.1:50052"]).warnings
    proc = dflash_gguf("llama", "rpc-server", "--help")
    assert proc.returncode == 0 and "--exact" in proc.stdout and "-devd none" not in proc.stdout
