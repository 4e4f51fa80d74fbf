"""The one llama-server launch that serve, generate, validate, release and bench all start.

    llama-server -m TARGET --host HOST --port PORT
                 -md DRAFT --spec-type draft-dflash --spec-draft-n-max N    the drafter's metadata
                 --metrics --parallel P [--rpc HOST:PORT,...]               the runner's own
                 [what a command adds for itself]                           validate: -c, in its report
                 [the user's arguments after --]                            last: they override ours

What `validate` certifies is therefore the command `serve` runs, plus the user's own arguments.
Arguments after `--` that name what the runner manages are honoured (the runner reads them and
uses them in place of its own: `--port`, `--host`, `-np`, `--spec-draft-n-max`, `--spec-tree-budget`,
`--spec-tree-p-min`, `--rpc`, `--api-key`) or
refused before anything starts, with the option to use instead (`-m`, `-md`, `--spec-type`, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dflash_gguf.errors import ServerArgsError
from dflash_gguf.gguf import layout
from dflash_gguf.gguf.drafter_fit import check_dflash2_shapes, check_fits_target
from dflash_gguf.gguf.describe import DrafterDescription, describe
from dflash_gguf.gguf.target import load_target
from dflash_gguf.options import AUTO, parse_rpc
from .build import REFERENCE_KERNELS_ENV, has_reference_kernels
from .server import DEFAULT_HOST, LlamaServer
from .speed import cpus as allowed_cpus

log = logging.getLogger(__name__)

DEFAULT_PARALLEL = 1  # one slot: DFlash acceptance drops with many (llama.cpp #27117)
THREADS = ("-t", "--threads")
SMALL_MACHINE_CPUS = 2


def default_threads(cpus: int | None = None) -> list[str]:
    """`-t 1` where this process may use two CPUs or fewer, unless the user's arguments set -t: llama.cpp's
    default there is a thread per core, and its thread pool spins at every barrier, so one other busy
    process makes a 2-thread server 10-20x slower while a 1-thread one keeps its pace
    (benchmarks/contention.py, docs/speed.md#threads-under-contention). On larger machines llama.cpp's
    own count stands; `tune` measures every count either way."""
    return ["-t", "1"] if (cpus or allowed_cpus()) <= SMALL_MACHINE_CPUS else []

# llama-server options the runner sets itself and cannot take from after `--`: the fix for each
_REFUSED: dict[tuple[str, ...], str] = {
    ("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-dr", "--docker-repo"):
        "the target is --target",
    ("-md", "--model-draft", "--spec-draft-model", "-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf"):
        "the drafter is --draft",
    ("--spec-type",): "the runner sets it from the drafter's metadata (draft-dflash or draft-dspark)",
    ("--ssl-key-file", "--ssl-cert-file"): "the runner talks plain HTTP to the server it starts",
    ("--models-dir", "--models-preset"): "the runner serves one target and its drafter",
}
MAX_TREE_BUDGET = 255  # a sequence per leaf: llama.cpp's LLAMA_MAX_SEQ (256) bounds the tree of one slot
# ... and the ones it honours: read from after `--` and used in place of its own
_HONOURED: dict[tuple[str, ...], str] = {
    ("--port",): "port",
    ("--host",): "host",
    ("-np", "--parallel"): "parallel",
    ("--spec-draft-n-max",): "draft_max",
    ("--spec-tree-budget",): "tree_budget",
    ("--spec-tree-p-min",): "tree_p_min",
    ("--rpc",): "rpc",
}
_API_KEY = ("--api-key",)
_API_KEY_FILE = ("--api-key-file",)
CTX_SIZE = ("-c", "--ctx-size")
SPLIT_MODE = ("-sm", "--split-mode")
# Drafters whose graph `--split-mode tensor` aborts upstream:
# GGML_ASSERT(src_ss[0].axis != GGML_BACKEND_SPLIT_AXIS_0) (llama.cpp #27819, #28777, #27829; fix pending in #27858)
TENSOR_SPLIT_ABORTS = frozenset({layout.DFLASH2, layout.DSPARK})

# `--exact`: what makes the CPU build batch-invariant for verification, so that speculative greedy
# output is token-identical to plain decoding (docs/validate.md, "Exact mode", for the measurements):
# no repacked weights, and ggml-cpu's reference kernels (patch 0007: no llamafile sgemm, no tiled
# K-quant matmul, no tiled or split-KV flash attention), so every row of a verify batch is computed
# by the same per-row kernels, in the same order, as one decoded token.
EXACT_ARGS = ("--no-repack",)
EXACT_ENV = {REFERENCE_KERNELS_ENV: "1"}


@functools.lru_cache(maxsize=None)  # once per build and process
def _check_reference_kernels(bin_dir: Path) -> None:
    if not has_reference_kernels(bin_dir):
        log.warning("--exact: the llama.cpp build in %s does not read %s (dflash-gguf's patch 0007), so only "
                    "%s applies and verify batches may still differ from one decoded token; run the patched "
                    "build (`dflash-gguf llama build`)", bin_dir, REFERENCE_KERNELS_ENV, " ".join(EXACT_ARGS))


def _split(arg: str) -> tuple[str, str | None]:
    """`--port=8080` -> ("--port", "8080"); `--port` -> ("--port", None)."""
    if arg.startswith("-") and "=" in arg:
        flag, _, value = arg.partition("=")
        return flag, value
    return arg, None


@dataclass(frozen=True)
class ServerArgs:
    """The user's llama-server arguments (after `--`), with what the runner honours taken out."""

    passthrough: tuple[str, ...] = ()
    honoured: dict[str, Any] = field(default_factory=dict)  # "port", "host", "parallel", "draft_max"
    api_key: str | None = None

    def value_of(self, flags: Sequence[str]) -> str | None:
        """The last value given to one of `flags` (llama.cpp takes the last), or None."""
        found = None
        args = list(self.passthrough)
        for i, arg in enumerate(args):
            flag, inline = _split(arg)
            if flag in flags:
                found = inline if inline is not None else (args[i + 1] if i + 1 < len(args) else None)
        return found


def _number(flag: str, value: str | None, low: int, high: int | None = None) -> int:
    try:
        number = int(value) if value is not None else None
    except ValueError:
        number = None
    if number is None or number < low or (high is not None and number > high):
        span = f"{low}..{high}" if high is not None else f"at least {low}"
        raise ServerArgsError(f"{flag} {value!r} after --: expected a whole number, {span}")
    return number


def _floor(flag: str, value: str | None) -> float:
    """A path probability floor: llama-server takes 0 (none) up to, not including, 1."""
    try:
        number = float(value) if value is not None else None
    except ValueError:
        number = None
    if number is None or not 0.0 <= number < 1.0:
        raise ServerArgsError(f"{flag} {value!r} after --: expected a probability, at least 0 and below 1")
    return number


# ggml-rpc.cpp's server loop accepts one connection and serves it until it closes; a llama-server
# holds its connection for its lifetime, so two llama-servers cannot share an rpc-server
ONE_CLIENT_PER_RPC_SERVER = (
    "--rpc: {command} runs two llama-servers side by side (the target alone and with the drafter), and an "
    "rpc-server serves one llama-server at a time; measure the RPC layout with `dflash-gguf validate --rpc` "
    "(one server after the other)")


def with_rpc(rpc: str | None, server_args: Sequence[str]) -> tuple[str, ...]:
    """A command's --rpc option folded into the arguments after `--` (where llama-server's own
    spelling is honoured too), refused when both give it differently."""
    args = tuple(str(a) for a in server_args)
    if rpc is None:
        return args
    given = parse_server_args(args).honoured.get("rpc")
    if given is not None and given != parse_rpc(rpc):
        raise ServerArgsError(f"--rpc is {rpc} but {','.join(given)} after --; give it once")
    return ("--rpc", ",".join(parse_rpc(rpc)), *args)


def _api_key_from_file(path: str) -> str | None:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ServerArgsError(f"{path}: {err.strerror or err}; --api-key-file after -- must be a readable file") from None
    return next((line for line in lines if line and not line.startswith("#")), None)


def parse_server_args(args: Sequence[str]) -> ServerArgs:
    """Refuse what the runner manages; take out what it honours; keep the rest, in order."""
    args = [str(a) for a in args]
    passthrough: list[str] = []
    honoured: dict[str, Any] = {}
    api_key = None
    i = 0
    while i < len(args):
        flag, inline = _split(args[i])
        for flags, fix in _REFUSED.items():
            if flag in flags:
                raise ServerArgsError(f"{flag} after --: {fix}; it cannot be given to llama-server here")
        takes = next((what for flags, what in _HONOURED.items() if flag in flags), None)
        if takes is not None or flag in _API_KEY + _API_KEY_FILE:
            value = inline
            if value is None:
                if i + 1 >= len(args):
                    raise ServerArgsError(f"{flag} after -- needs a value")
                value, i = args[i + 1], i + 1
            if takes == "port":
                honoured[takes] = _number(flag, value, 1, 65535)
            elif takes == "rpc":
                honoured[takes] = parse_rpc(value, f"{flag} after --")
            elif takes == "host":
                if "," in value or value.endswith(".sock"):
                    raise ServerArgsError(f"--host {value!r} after --: the runner talks to one TCP address; give one host")
                honoured[takes] = value
            elif takes == "draft_max" and value.strip().lower() == AUTO:
                honoured[takes] = AUTO
            elif takes == "tree_budget":
                honoured[takes] = _number(flag, value, 0, MAX_TREE_BUDGET)
            elif takes == "tree_p_min":
                honoured[takes] = _floor(flag, value)
            elif takes is not None:
                honoured[takes] = _number(flag, value, 1)
            else:  # an API key is honoured by sending it, and stays on llama-server's command line
                key = value.split(",")[0] if flag in _API_KEY else _api_key_from_file(value)
                api_key = key or api_key
                passthrough += [flag, value]
        else:
            passthrough.append(args[i])
        i += 1
    return ServerArgs(tuple(passthrough), honoured, api_key)


def _once(name: str, option: Any, given: ServerArgs) -> Any:
    """The value of a setting given as an option or after `--`: refused when they disagree."""
    after = given.honoured.get(name)
    if option is not None and after is not None and option != after:
        flag = {"draft_max": "--draft-max", "parallel": "--parallel"}.get(name, f"--{name}")
        option, after = (",".join(v) if isinstance(v, tuple) else v for v in (option, after))
        raise ServerArgsError(f"{flag} is {option} but {after} after --; give it once")
    return after if after is not None else option


def split_mode_problem(draft: DrafterDescription, server_args: Sequence[str]) -> str | None:
    """Why llama-server would abort with these arguments and this drafter, with the fix; None when it would not."""
    mode = ServerArgs(tuple(server_args)).value_of(SPLIT_MODE) or os.environ.get("LLAMA_ARG_SPLIT_MODE")
    if mode is None or mode.strip().lower() != "tensor" or draft.variant not in TENSOR_SPLIT_ABORTS:
        return None
    return (f"--split-mode tensor with a {draft.variant_name} drafter ({draft.path.name}) aborts in llama.cpp "
            "(GGML_ASSERT(src_ss[0].axis != GGML_BACKEND_SPLIT_AXIS_0), llama.cpp #27819, #27829, #28777; "
            "fix pending in #27858); use --split-mode layer after --")


DRAFT_DEVICE = ("-devd", "--spec-draft-device", "--device-draft")


def rpc_draft_device_problem(rpc: Sequence[str], server_args: Sequence[str]) -> str | None:
    """`-devd none` beside `--rpc`: the drafter computes its logits with the target's output layer
    (borrowed through ctx_other), which --rpc places on an RPC server, and a drafter limited to the
    head's CPU cannot run an operation on it: llama.cpp aborts at start-up (ggml-backend.cpp,
    "pre-allocated tensor (token_embd.weight) in a buffer (RPC0[...]) that cannot run the operation")."""
    device = ServerArgs(tuple(server_args)).value_of(DRAFT_DEVICE)
    if not rpc or device is None or device.strip().lower() != "none":
        return None
    return ("-devd none with --rpc: the drafter uses the target's output layer, which --rpc puts on an RPC "
            "server, and llama.cpp aborts when the drafter may not run there (pre-allocated tensor in a buffer "
            "that cannot run the operation); leave -devd out, so the drafter follows --device")


def read_draft(draft_gguf: str | Path) -> DrafterDescription:
    """The description of a drafter GGUF llama-server can run (CheckpointError otherwise)."""
    desc = describe(draft_gguf)
    desc.require_runnable()
    return desc


def speculative_args(draft: str | Path | DrafterDescription, draft_max: int | str | None = None,
                     shown_path: str | None = None) -> list[str]:
    """The drafter's part of the recipe: `-md`, `--spec-type` and the longest draft it was trained
    for (`draft_max` shortens it; llama.cpp would clamp a longer one). `shown_path` replaces the
    file's path (a model card names the file as it is published)."""
    desc = draft if isinstance(draft, DrafterDescription) else describe(draft)
    desc.require_runnable()
    if draft_max == AUTO:
        n_max: int | str = AUTO
    else:
        n_max = desc.draft_length if draft_max is None else min(int(draft_max), desc.draft_length)
    return ["-md", shown_path or str(desc.path), "--spec-type", str(desc.spec_type), "--spec-draft-n-max", str(n_max)]


def check_pair(target_gguf: str | Path, draft: str | Path | DrafterDescription) -> list[str]:
    """The converter's rules on a (target, drafter) GGUF pair: DflashError when the drafter cannot
    run with this target (hidden size, layer range, vocabulary, mask token, DFlash 2 shapes);
    the warnings otherwise."""
    desc = draft if isinstance(draft, DrafterDescription) else read_draft(draft)
    facts = desc.facts()
    check_dflash2_shapes(facts)
    return check_fits_target(facts, load_target(target_gguf))


@dataclass(frozen=True)
class Launch:
    """One llama-server command line for a target and (optionally) its drafter."""

    target: Path
    draft: DrafterDescription | None
    parallel: int = DEFAULT_PARALLEL
    draft_max: int | str | None = None  # AUTO: llama-server chooses each step's length up to the drafter's
    tree_budget: int = 0            # --spec-tree-budget: nodes of a draft tree verified per step (0: the chain)
    tree_p_min: float = 0.0         # --spec-tree-p-min: ... none whose path probability is below it (0: the budget)
    host: str = DEFAULT_HOST
    port: int | None = None
    api_key: str | None = None
    rpc: tuple[str, ...] = ()       # ggml-rpc-server addresses the target is spread over (--rpc)
    user_args: tuple[str, ...] = ()
    added: tuple[str, ...] = ()     # what a command adds for its own purpose (validate: -c N)
    exact: bool = False             # EXACT_ARGS: batch-invariant verification
    warnings: tuple[str, ...] = ()  # the pair check's, for the command line to print once

    @property
    def draft_length(self) -> int | None:
        """The --spec-draft-n-max in effect: the drafter's trained length, or shorter if asked."""
        if self.draft is None:
            return None
        if self.draft_max is None or self.draft_max == AUTO:
            return self.draft.draft_length
        return min(self.draft_max, self.draft.draft_length)

    @property
    def draft_setting(self) -> int | str | None:
        """What reports give as the draft length: the --spec-draft-n-max in effect, or "auto"."""
        return AUTO if self.auto else self.draft_length

    @property
    def auto(self) -> bool:
        """Whether llama-server chooses the draft length each step (--spec-draft-n-max auto)."""
        return self.draft is not None and self.draft_max == AUTO

    def speculative_args(self) -> list[str]:
        if self.draft is None:
            return []
        tree = ["--spec-tree-budget", str(self.tree_budget)] if self.tree_budget else []
        tree += ["--spec-tree-p-min", f"{self.tree_p_min:g}"] if self.tree_budget and self.tree_p_min else []
        return [*speculative_args(self.draft, AUTO if self.auto else self.draft_length), *tree]

    def recipe(self) -> list[str]:
        """The runner's own arguments: the drafter's, the threads of a small machine, --metrics, the
        slots, the RPC servers, --exact's."""
        rpc = ["--rpc", ",".join(self.rpc)] if self.rpc else []
        threads = [] if self.user_value(THREADS) is not None else default_threads()
        return [*self.speculative_args(), *threads, "--metrics", "--parallel", str(self.parallel), *rpc,
                *(EXACT_ARGS if self.exact else ())]

    def args(self) -> list[str]:
        """Everything after `-m TARGET --host HOST --port PORT`."""
        return [*self.recipe(), *self.added, *self.user_args]

    def user_value(self, flags: Sequence[str]) -> str | None:
        return ServerArgs(self.user_args).value_of(flags)

    def adding(self, *args: str) -> "Launch":
        """The same launch plus arguments a command needs for itself (reported as such)."""
        return dataclasses.replace(self, added=(*self.added, *map(str, args)))

    def alone(self, model: str | Path | None = None) -> "Launch":
        """The same launch without the drafter (and on `model` instead of the target, if given)."""
        return dataclasses.replace(self, draft=None, target=Path(model) if model else self.target)

    def server(self, **kwargs: Any) -> LlamaServer:
        """A LlamaServer for this launch, not started (kwargs: bin_dir, backend, log_path, ...)."""
        env = kwargs.pop("env", None)
        if self.exact:
            env = {**(os.environ if env is None else env), **EXACT_ENV}
        server = LlamaServer(self.target, self.args(), host=self.host, port=self.port, api_key=self.api_key,
                             env=env, **kwargs)
        if self.exact:
            _check_reference_kernels(server.exe.parent)
        return server

    def summary(self) -> dict[str, Any]:
        """What a report says about the launch."""
        return {"recipe": self.recipe(),
                "user_args": list(self.user_args), "added": list(self.added)}


def launch_recipe(target: str | Path, draft: str | Path | None, *, parallel: int | None = None,
                  draft_max: int | None = None, host: str | None = None, port: int | None = None,
                  server_args: Sequence[str] = (), check: bool = True, exact: bool = False,
                  rpc: Sequence[str] | None = None) -> Launch:
    """The launch for `target` with `draft` as its drafter. Options left None take the value given
    after `--` (`server_args`), else the recipe's default. `check` applies the converter's rules to
    the pair first (DflashError before any process starts); its warnings come back in the Launch.
    `exact` adds EXACT_ARGS (batch-invariant verification)."""
    given = parse_server_args(server_args)
    desc = read_draft(draft) if draft is not None else None
    problem = split_mode_problem(desc, given.passthrough) if desc is not None else None
    rpc_servers = _once("rpc", tuple(rpc) if rpc else None, given) or ()
    problem = problem or (rpc_draft_device_problem(rpc_servers, given.passthrough) if desc is not None else None)
    if problem is not None:
        raise ServerArgsError(problem)
    warnings = tuple(check_pair(target, desc)) if desc is not None and check else ()
    if exact and rpc_servers:
        warnings += ("--exact with --rpc: the RPC servers compute their layers with their own kernels; start each "
                     "with `dflash-gguf llama rpc-server --exact` (GGML_CPU_USE_REF=1), or their layers are not "
                     "batch-invariant",)
    draft_max = _once("draft_max", draft_max, given)
    tree_budget = given.honoured.get("tree_budget", 0)
    if tree_budget and draft_max == AUTO:
        raise ServerArgsError("--spec-tree-budget after -- with --draft-max auto: the controller chooses chain lengths "
                              "and does not verify trees yet; give one of them")
    if tree_budget and desc is None:
        raise ServerArgsError("--spec-tree-budget after --: a draft tree needs a drafter (--draft)")
    tree_p_min = given.honoured.get("tree_p_min", 0.0)
    if tree_p_min and not tree_budget:
        raise ServerArgsError("--spec-tree-p-min after -- without --spec-tree-budget N: the floor stops a draft tree "
                              "(the chain's is --spec-draft-p-min); give a budget too")
    return Launch(
        target=Path(target), draft=desc,
        parallel=_once("parallel", parallel, given) or DEFAULT_PARALLEL,
        draft_max=draft_max, tree_budget=tree_budget, tree_p_min=tree_p_min,
        host=_once("host", host, given) or DEFAULT_HOST,
        port=_once("port", port, given),
        rpc=rpc_servers,
        api_key=given.api_key, user_args=given.passthrough, warnings=warnings, exact=exact)


def dflash_server(target: str | Path, draft: str | Path | None, *, server_args: Sequence[str] = (),
                  parallel: int | None = None, draft_max: int | None = None, host: str | None = None,
                  port: int | None = None, check: bool = True, **kwargs: Any) -> LlamaServer:
    """`launch_recipe(...).server(**kwargs)`: a LlamaServer for the target and its drafter, not started."""
    launch = launch_recipe(target, draft, parallel=parallel, draft_max=draft_max, host=host, port=port,
                           server_args=server_args, check=check)
    return launch.server(**kwargs)
