"""The target spread over two `ggml-rpc-server` processes on 127.0.0.1 (llama.cpp RPC), the drafter
on the head llama-server: lossless, and the same acceptance as the run on one machine. The
rpc-servers are owned and reaped like llama-server."""

from __future__ import annotations

import json
import os
import socket

import pytest

from dflash_gguf.errors import ServerStartError
from dflash_gguf.runner.rpc import RpcServer
from tests.conftest import dflash_gguf

pytestmark = pytest.mark.integration


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def rpc_servers(llama_bin):
    with RpcServer(bin_dir=llama_bin, threads=1) as a, RpcServer(bin_dir=llama_bin, threads=1) as b:
        pids = [a.pid, b.pid]
        yield [a, b]
    assert all(gone(pid) for pid in pids)


@pytest.fixture(scope="module")
def prompts(trained_pair, tmp_path_factory):
    path = tmp_path_factory.mktemp("rpc-prompts") / "prompts.txt"
    path.write_text("".join(trained_pair["prompts"].read_text().splitlines(keepends=True)[:3]))
    return path


def validate(trained_pair, prompts, *args):
    proc = dflash_gguf("validate", "--target", trained_pair["target"], "--draft", trained_pair["dflash"],
                       "--prompts", prompts, "-n", "32", "--json", "--backend", "cpu", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_target_over_two_rpc_servers_is_lossless_with_the_local_acceptance(trained_pair, prompts, rpc_servers):
    rpc = ",".join(s.address for s in rpc_servers)
    local = validate(trained_pair, prompts, "--", "-t", "1")
    remote = validate(trained_pair, prompts, "--rpc", rpc, "--", "-t", "1")
    assert remote["exact"] and remote["divergences"] == [] and remote["positions_checked"] == remote["produced"]
    assert remote["launch"]["recipe"][-2:] == ["--rpc", rpc]
    assert "--rpc" in remote["launch"]["speculative_command"] and "--rpc" in remote["launch"]["target_command"]
    same = [(p["tokens"], p["draft_n"], p["draft_n_accepted"]) for p in local["prompts"]]
    assert [(p["tokens"], p["draft_n"], p["draft_n_accepted"]) for p in remote["prompts"]] == same
    assert remote["mean_acceptance_length"] == pytest.approx(local["mean_acceptance_length"], rel=0.01)
    assert remote["mean_acceptance_length"] > 1.5


def test_the_target_layers_are_on_both_rpc_servers(trained_pair, rpc_servers, tmp_path):
    log = tmp_path / "server.log"
    rpc = ",".join(s.address for s in rpc_servers)
    proc = dflash_gguf("generate", "--target", trained_pair["target"], "--draft", trained_pair["dflash"],
                       "--rpc", rpc, "--log", log, "--json", "-n", "16", "--backend", "cpu", "def add(a, b):",
                       "--", "-t", "1", "-lv", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["draft_n_accepted"] > 0
    # at -lv 4: "load_tensors: RPC0[127.0.0.1:PORT] model buffer size =     6.01 MiB", one line per server
    placed = [line for line in log.read_text(errors="replace").splitlines() if "model buffer size" in line]
    for server in rpc_servers:
        assert any(f"[{server.address}] model buffer size" in line for line in placed), placed


def test_an_rpc_server_that_cannot_start_says_why_and_leaves_nothing_running(llama_bin):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = RpcServer(bin_dir=llama_bin, port=taken.getsockname()[1], startup_timeout=20)
        with pytest.raises(ServerStartError, match=f"127.0.0.1:{taken.getsockname()[1]} is in use"):
            server.start()
    assert server.pid is None
    with RpcServer(bin_dir=llama_bin, threads=1) as one:
        pid = one.pid
        assert not gone(pid)
    assert gone(pid)


def test_llama_rpc_server_prints_its_address_and_stops_on_sigterm(llama_bin):
    import signal
    import subprocess
    import sys

    from dflash_gguf.runner.server import free_port

    port = free_port()
    env = {**os.environ, "DFLASH_GGUF_LLAMA_BIN": str(llama_bin)}
    proc = subprocess.Popen([sys.executable, "-m", "dflash_gguf.cli", "llama", "rpc-server", "--port", str(port),
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == f"127.0.0.1:{port}"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
