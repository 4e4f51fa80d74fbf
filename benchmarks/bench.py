"""`make bench`: what dflash-gguf's files cost and buy, measured side by side in one run.

    make bench                    # or: .venv/bin/python -m benchmarks.bench [--quick] [--json OUT]

Sections (all in one process, one after the other, on the same machine and llama.cpp build):

  (a) conversion of a 2 GiB bf16 drafter by the pinned upstream converter and by `dflash-gguf
      convert` (benchmarks/bench_convert.py's generator and measurement: wall time, peak RSS);
  (b) decoding on the patched CPU llama-server: the target alone against each drafter, each
      drafter at F16, Q8_0 and Q4_K_M (default recipe), with 1 and 4 slots: exactness, tau,
      acceptance rate, tokens/s of the target alone and with the drafter (both from the same
      `validate` run), speedup;
  (c) tau in llama.cpp beside the z-lab PyTorch reference's tau on the same token ids (F16, -np 1);
  (d) quantization recipes: Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0 x every recipe of `quantize`:
      file size, tau, tau per MiB;
  (e) where a speculative step's time goes (llama-server at trace verbosity: drafting time against
      the rest of the step, beside the target's own time per token and llama-bench's; where `perf`
      is installed, the share of CPU samples per library);
  (f) the two regimes (benchmarks/regimes.py): the target as it is (compute-bound) and widened by
      inert FFN units to a memory-bound size, at F16 and Q8_0, both drafters: speedup, tau,
      efficiency, and the step decomposition in target tokens;
  (g) the real target (benchmarks/real_target.py): SmolLM2-135M-Instruct at F16, Q8_0 and Q4_K_M with
      the drafters trained for it, on the held-out chat prompts: tau, acceptance per draft position,
      speedup with serve's defaults and with the tuned setting, llama-bench's verification cost.
  (h) concurrency (benchmarks/concurrency.py, `dflash-gguf bench`): speedup against 1-8 streams in
      flight on the trained pair, its memory-bound widening and SmolLM2 when present, acceptance per
      slot, every stream compared with the target alone; its own page, docs/benchmarks-concurrency.md (+ .png).

It writes docs/benchmarks.md (tables, machine, date, llama build, commands to reproduce) and
docs/benchmarks.png. Every speed figure is a ratio of two things measured in the same run; nothing
here asserts a time. With the trained pair (tests/fixtures/trained/{target,dflash,dflash2,dspark}) present it
benchmarks that; without it (or with --quick) it falls back to the tiny random-weight fixtures, whose
tau means nothing, so that the script itself can be exercised.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import real_target, regimes
from dflash_gguf.quantize.quantize import DEFAULT_RECIPE
from dflash_gguf.quantize.quantize import RECIPES as RECIPE_TABLE
from dflash_gguf.runner.speed_verdict import batch_cost_verdict, drafting_pays, speed_verdict


REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
WORK = REPO / "build" / "bench"
BACKEND = "cpu"  # the llama.cpp build measured: main() sets it from --backend

DRAFTER_LABELS = {"dflash": "DFlash", "dflash2": "DFlash 2", "dspark": "DSpark"}
DECODE_TYPES = ("F16", "Q8_0", "Q4_K_M")
RECIPE_TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")
RECIPES = tuple(RECIPE_TABLE)
PARALLEL = (1, 4)

_T0 = time.perf_counter()


def progress(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------------

def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    except OSError:
        return ""


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def training_running() -> list[str]:
    """Command lines of running `train_pair` processes (they load both cores)."""
    out = _run(["pgrep", "-af", "train_pair"])
    return [ln for ln in out.splitlines() if ln.strip() and "pgrep" not in ln]


def machine_info() -> dict:
    model = next((ln.split(":", 1)[1].strip() for ln in _run(["lscpu"]).splitlines()
                  if ln.startswith("Model name")), platform.processor() or "unknown")
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {"nproc": _run(["nproc"]).strip() or str(os.cpu_count()), "cpu": model,
            "memory_gib": round(mem / 2**30, 1), "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


# ---------------------------------------------------------------------------------------------
# (a) conversion against the pinned upstream converter
# ---------------------------------------------------------------------------------------------

def conversion_section() -> dict:
    from benchmarks import bench_convert

    return bench_convert.compare(progress=lambda msg: progress(f"(a) {msg}"))


# ---------------------------------------------------------------------------------------------
# The models: the trained pair, or the random-weight fixtures
# ---------------------------------------------------------------------------------------------

@dataclass
class Models:
    kind: str                      # "trained" or "random"
    target: Path                   # target GGUF
    drafters: dict[str, Path]      # "dflash"/"dflash2" -> F16 drafter GGUF
    prompts: list[str]
    prompts_file: Path | None
    reference_target: Path         # HF folders for the PyTorch reference
    reference_drafters: dict[str, Path]
    quantized: dict[tuple[str, str, str], tuple[Path, dict]] = field(default_factory=dict)


def trained_pair_ready() -> bool:
    from training.fixtures.trained_gguf import DRAFTERS, TRAINED

    return all((TRAINED / d / "config.json").is_file() and (TRAINED / d / "model.safetensors").is_file()
               for d in DRAFTERS) and (TRAINED / "eval_prompts.json").is_file()


def trained_models() -> Models:
    from dflash_gguf.runner.prompts import read_prompts
    from training.fixtures.trained_gguf import DRAFTERS, TRAINED, trained_ggufs

    paths = trained_ggufs()
    return Models("trained", paths["target"], {d: paths[d] for d in DRAFTERS}, read_prompts(paths["prompts"]),
                  paths["prompts"], TRAINED / "target", {d: TRAINED / d for d in DRAFTERS})


def random_models() -> Models:
    from dflash_gguf.convert.converter import convert
    from dflash_gguf.runner.prompts import BUILTIN_PROMPTS
    from training.fixtures.tiny_models import cached_fixtures
    from training.fixtures.upstream import cached_target_gguf

    fixtures, target = cached_fixtures(), cached_target_gguf()
    out = WORK / "random"
    out.mkdir(parents=True, exist_ok=True)
    sources = {"dflash": fixtures / "dflash-b16", "dflash2": fixtures / "dflash2-b8"}
    drafters = {}
    for name, src in sources.items():
        drafters[name] = out / f"{name}.gguf"
        if not drafters[name].is_file():
            convert(src, target, drafters[name], "f16")
    return Models("random", target, drafters, list(BUILTIN_PROMPTS[:4]), None, fixtures / "target-hf", sources)


def describe_models(models: Models) -> str:
    """One line on the pair, read from the HF configs (and the target GGUF's size)."""
    def cfg(folder: Path) -> dict:
        try:
            return json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            return {}

    t = cfg(models.reference_target)
    parts = [f"target {t.get('architectures', ['?'])[0]} width {t.get('hidden_size')}, {t.get('num_hidden_layers')} "
             f"layers, vocabulary {t.get('vocab_size')}, {models.target.stat().st_size / 2**20:.1f} MiB GGUF"]
    for name, folder in models.reference_drafters.items():
        d = cfg(folder)
        block = (d.get("dflash_config") or {}).get("block_size", d.get("block_size"))
        parts.append(f"{DRAFTER_LABELS[name]}: {d.get('num_hidden_layers')} layers, block {block}")
    return "; ".join(parts)


def drafter_file(models: Models, drafter: str, qtype: str, recipe: str) -> tuple[Path, dict]:
    """The drafter at `qtype` (F16: the conversion; else quantized from it with `recipe`), made once
    per run: (path, {bytes, types, fallbacks})."""
    from dflash_gguf.quantize.quantize import quantize

    src = models.drafters[drafter]
    if qtype == "F16":
        return src, {"bytes": src.stat().st_size, "types": _tensor_types(src), "fallbacks": []}
    key = (drafter, qtype, recipe)
    if key not in models.quantized:
        out = WORK / models.kind / f"{drafter}-{qtype}-{recipe}.gguf"
        out.parent.mkdir(parents=True, exist_ok=True)
        result = quantize(src, out, qtype, recipe, backend=BACKEND)
        models.quantized[key] = (out, {"bytes": result.bytes, "types": result.types, "fallbacks": result.fallbacks})
    return models.quantized[key]


def _tensor_types(path: Path) -> dict[str, int]:
    from collections import Counter

    from dflash_gguf.gguf.reader import GGUFFile

    with GGUFFile(path) as f:
        return dict(sorted(Counter(t.type.name for t in f.tensors.values()).items()))


# ---------------------------------------------------------------------------------------------
# (b) + (c) decoding, (d) recipes
# ---------------------------------------------------------------------------------------------

def _validate(models: Models, draft: Path, n_predict: int, parallel: int, reference: str | None = None) -> dict:
    from dflash_gguf.validation.validate import ValidationSettings, validate

    settings = ValidationSettings(n_predict=n_predict, parallel=parallel, backend=BACKEND,
                                  reference_draft=models.reference_drafters[reference] if reference else None,
                                  reference_target=models.reference_target if reference else None)
    return validate(models.target, draft, models.prompts, settings, progress=lambda m: progress("    " + m)).to_dict()


def _row(report: dict) -> dict:
    return {"exact": report["exact"], "divergences": [d.get("kind") for d in report["divergences"]],
            "prompts": len(report["prompts"]),
            "divergence_at": [{"prompt": d["prompt"][:32], "position": d.get("position"), "kind": d.get("kind"),
                               "margin": d.get("margin")} for d in report["divergences"]],
            "tau": report["mean_acceptance_length"], "acceptance_rate": report["acceptance_rate"],
            "drafted": report["drafted"], "accepted": report["accepted"], "produced": report["produced"],
            "tps_target": report["tokens_per_second"]["target"],
            "tps_speculative": report["tokens_per_second"]["speculative"], "speedup": report["speedup"]}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def decode_section(models: Models, n_predict: int, with_reference: bool,
                   repeats: int) -> tuple[list[dict], list[dict], str]:
    """Each configuration validated `repeats` times (the PyTorch reference only in the first): a
    validate run times the target alone and the speculative server one after the other, so each
    run's speedup is a side-by-side ratio; the table gives the median run and the range."""
    rows, parity, build = [], [], ""
    for drafter in models.drafters:
        for qtype in DECODE_TYPES:
            path, info = drafter_file(models, drafter, qtype, DEFAULT_RECIPE)
            for parallel in PARALLEL:
                ref = drafter if (with_reference and qtype == "F16" and parallel == 1) else None
                progress(f"(b) {DRAFTER_LABELS[drafter]} {qtype} -np {parallel}: validate x{repeats}, "
                         f"{len(models.prompts)} prompts x {n_predict} tokens" + (" + PyTorch reference" if ref else ""))
                reports = [_validate(models, path, n_predict, parallel, ref if i == 0 else None)
                           for i in range(repeats)]
                report = reports[0]
                build = report["llama"]["build"]
                runs = [_row(r) for r in reports]
                speedups = [r["speedup"] or 0.0 for r in runs]
                median_run = min(runs, key=lambda r: abs((r["speedup"] or 0.0) - _median(speedups)))
                row = {"drafter": drafter, "type": qtype, "parallel": parallel,
                       "mib": round(info["bytes"] / 2**20, 2), **runs[0],
                       "tps_target": median_run["tps_target"], "tps_speculative": median_run["tps_speculative"],
                       "speedup": median_run["speedup"], "speedup_runs": speedups,
                       "tau_runs": [r["tau"] for r in runs],
                       "exact": all(r["exact"] for r in runs),
                       "divergences": max((r["divergences"] for r in runs), key=len)}
                rows.append(row)
                progress(f"(b) -> exact {row['exact']}, tau {row['tau']:.3f}, acceptance {row['acceptance_rate']:.3f}, "
                         f"{row['tps_target']:.1f} -> {row['tps_speculative']:.1f} tok/s ({row['speedup']}x; "
                         f"runs {', '.join(f'{x:.2f}' for x in speedups)})")
                if ref and report.get("reference"):
                    r = report["reference"]
                    tau_ref = r["mean_acceptance_length"]
                    ref_tokens = [p["tokens"] for p in r["prompts"]]
                    llama_tokens = [p["tokens"] for p in report["prompts"]]
                    tau = report["mean_acceptance_length"]
                    parity.append({"drafter": drafter, "tau_llama": tau, "tau_reference": tau_ref,
                                   "relative_difference": round((tau - tau_ref) / tau_ref, 4) if tau_ref else None,
                                   "tokens_llama": sum(llama_tokens), "tokens_reference": sum(ref_tokens),
                                   "prompts_same_length": sum(a == b for a, b in zip(llama_tokens, ref_tokens)),
                                   "prompts": len(ref_tokens),
                                   "per_prompt": [(a["mean_acceptance_length"]) for a in r["prompts"]]})
                    progress(f"(c) {DRAFTER_LABELS[drafter]}: tau llama.cpp {tau:.3f} vs reference {tau_ref:.3f}")
    return rows, parity, build


def recipe_section(models: Models, n_predict: int) -> list[dict]:
    rows = []
    for drafter in models.drafters:
        for qtype in RECIPE_TYPES:
            for recipe in RECIPES:
                path, info = drafter_file(models, drafter, qtype, recipe)
                progress(f"(d) {DRAFTER_LABELS[drafter]} {qtype} {recipe}: {info['bytes'] / 2**20:.2f} MiB; validate")
                report = _validate(models, path, n_predict, 1)
                mib = info["bytes"] / 2**20
                rows.append({"drafter": drafter, "type": qtype, "recipe": recipe, "mib": round(mib, 3),
                             "types": info["types"], "fallbacks": len(info["fallbacks"]), "exact": report["exact"],
                             "divergences": [d.get("kind") for d in report["divergences"]],
                             "divergence_at": _row(report)["divergence_at"],
                             "tau": report["mean_acceptance_length"],
                             "acceptance_rate": report["acceptance_rate"],
                             "tau_per_mib": round(report["mean_acceptance_length"] / mib, 4)})
                progress(f"(d) -> tau {report['mean_acceptance_length']:.3f}, exact {report['exact']}")
        path, info = drafter_file(models, drafter, "F16", "")
        progress(f"(d) {DRAFTER_LABELS[drafter]} F16 (reference row): validate")
        report = _validate(models, path, n_predict, 1)
        mib = info["bytes"] / 2**20
        rows.append({"drafter": drafter, "type": "F16", "recipe": "-", "mib": round(mib, 3), "types": info["types"],
                     "fallbacks": 0, "exact": report["exact"],
                     "divergences": [d.get("kind") for d in report["divergences"]],
                     "divergence_at": _row(report)["divergence_at"],
                     "tau": report["mean_acceptance_length"],
                     "acceptance_rate": report["acceptance_rate"],
                     "tau_per_mib": round(report["mean_acceptance_length"] / mib, 4)})
    return rows


# ---------------------------------------------------------------------------------------------
# (e) where the time goes
# ---------------------------------------------------------------------------------------------

_STATS = re.compile(r"statistics\s+(\S+):.*?#gen tokens =\s*(\d+), #acc tokens =\s*(\d+).*?"
                    r"dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms")


def _llama_bench(target: Path, bin_dir: Path, batches: list[int]) -> dict:
    """llama-bench on the target alone: ms per decoded token ("tg") and ms per batch of B tokens (B)."""
    from dflash_gguf.runner.build import runtime_env

    cmd = [str(bin_dir / "llama-bench"), "-m", str(target), "-p", ",".join(str(b) for b in batches),
           "-n", "32", "-r", "5", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=runtime_env(bin_dir), check=False)
    try:
        runs = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {}
    out = {}
    for r in runs:
        if r.get("n_gen"):
            out["tg"] = round(1000.0 / r["avg_ts"], 3)
        else:
            out[int(r["n_prompt"])] = round(1000.0 * r["n_prompt"] / r["avg_ts"], 3)
    return out


# What the CPU samples of a llama-server are spent on, by symbol (first match wins): the categories
# issue 15 asks about (graph rebuilds, synchronisation, sampling over the block, copies of hidden
# states, thread barriers) beside the arithmetic itself.
PERF_GROUPS = (
    ("matrix multiply", ("tinyBLAS", "gemm", "gemv", "ggml_vec_dot", "mul_mat", "quantize_row", "fp32_to_fp16")),
    ("attention (flash attn, softmax, exp)", ("flash_attn", "soft_max", "expf", "ggml_vec_max")),
    ("sampling", ("sampler", "llama_token_data", "top_k", "random_device", "cmp_top_k")),
    ("copies, fills (cpy, concat, pad, rows, memcpy, memset)", ("forward_dup", "forward_cpy", "forward_concat",
                                                                "get_rows", "set_rows", "memmove", "memcpy",
                                                                "forward_pad", "memset")),
    ("thread sync (barriers, spinning, futex)", ("libgomp", "barrier", "futex", "graph_compute_thread",
                                                 "threadpool", "finish_task_switch", "sched_yield",
                                                 "try_to_wake_up", "_raw_spin")),
    ("graph build + allocation", ("gallocr", "backend_sched", "visit_parents", "graph_plan", "llama_kv_cache",
                                  "llama_batch", "::graph", "build_", "ggml_new_tensor", "ggml_is_empty",
                                  "malloc", "free", "unlink_chunk", "_Rb_tree", "_Hashtable")),
    ("other ggml ops (norm, rope, add, act)", ("libggml",)),
    ("kernel, other", ("[kernel", "[vdso")),
)


def perf_group(dso: str, symbol: str) -> str:
    where = f"{dso} {symbol}"
    return next((name for name, keys in PERF_GROUPS if any(k in where for k in keys)), "other")


@contextlib.contextmanager
def _perf_record(pid: int, out: Path):
    """`perf record` on a running process while the block runs; yields a dict that gets "shares"
    (percent of CPU samples per PERF_GROUPS category) afterwards. Nothing when perf is missing or refused."""
    result: dict = {}
    exe = shutil.which("perf")
    if exe is None:
        yield result
        return
    proc = subprocess.Popen([exe, "record", "-F", "999", "-o", str(out), "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        yield result
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if not out.is_file():  # perf exits non-zero when interrupted; the file tells
        return
    report = _run([exe, "report", "-i", str(out), "--no-children", "--sort", "dso,sym", "--stdio", "-g", "none"])
    shares = {name: 0.0 for name, _ in PERF_GROUPS}
    shares["other"] = 0.0
    for m in re.finditer(r"^\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(.*?)\s*$", report, re.MULTILINE):
        shares[perf_group(m.group(2), m.group(3))] += float(m.group(1))
    if sum(shares.values()) > 0:
        result["shares"] = {k: round(v, 1) for k, v in shares.items()}


def profile_section(models: Models, n_predict: int, rounds: int = 3) -> list[dict]:
    """Sequential requests on a server with and without each F16 drafter, at trace verbosity: the
    drafter's own cumulative timers (begin, draft, accept) against the server's generation time."""
    from dflash_gguf.runner.build import find_bin_dir
    from dflash_gguf.runner.launch import launch_recipe
    from dflash_gguf.runner.measure import measuring_launch

    bin_dir = find_bin_dir(BACKEND)
    log_dir = WORK / models.kind / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    def serve(label: str, draft: Path | None) -> dict:
        log_path = log_dir / f"profile-{label}.log"
        # validate's launch (serve's recipe + a context for the prompts), at trace verbosity
        launch = measuring_launch(launch_recipe(models.target, draft, server_args=["-lv", "4"]),
                                  models.prompts, n_predict)
        with launch.server(bin_dir=bin_dir, log_path=log_path) as server:
            srv = server.client
            ids = [srv.tokenize(p, add_special=True, parse_special=True) for p in models.prompts]
            srv.complete(ids[0][:8], 8, temperature=0.0, seed=0, cache_prompt=False)  # warm-up
            warm_log = log_path.read_text(errors="replace")
            done = [srv.complete(i, n_predict, temperature=0.0, seed=0, cache_prompt=False)
                    for _ in range(rounds) for i in ids]
            text = log_path.read_text(errors="replace")
            # one more round, not timed, under `perf record`: where the CPU samples fall, by library
            with _perf_record(server.pid, log_dir / f"perf-{label}.data") as samples:
                for i in ids:
                    srv.complete(i, n_predict, temperature=0.0, seed=0, cache_prompt=False)
        stats = _STATS.findall(text)
        warm = _STATS.findall(warm_log)
        out = {"requests": len(done), "tokens": sum(c.n_predicted for c in done),
               "predicted_ms": sum(float(c.timings.get("predicted_ms", 0)) for c in done),
               "prompt_ms": sum(float(c.timings.get("prompt_ms", 0)) for c in done),
               "prompt_tokens": sum(int(c.timings.get("prompt_n", 0)) for c in done),
               "draft_n": sum(c.draft_n for c in done), "accepted": sum(c.draft_n_accepted for c in done),
               "perf": samples.get("shares")}
        if stats:
            # the timers are cumulative over the server's life: take away the warm-up request's share
            last = [float(x) for x in stats[-1][3:]]
            first = [float(x) for x in warm[-1][3:]] if warm else [0.0, 0.0, 0.0]
            out["begin_ms"], out["draft_ms"], out["accept_ms"] = (round(a - b, 2) for a, b in zip(last, first))
        return out

    from dflash_gguf.runner.launch import read_draft

    blocks = sorted({read_draft(path).block_size for path in models.drafters.values()})
    progress(f"(e) llama-bench on the target: decode of 1 token, batches of {blocks}")
    bench = _llama_bench(models.target, bin_dir, blocks)
    rows = []
    progress("(e) target alone, trace verbosity")
    alone = serve("target", None)
    perf_rows = [{"label": "target alone", **alone["perf"]}] if alone.get("perf") else []
    per_token = alone["predicted_ms"] / max(1, alone["tokens"] - alone["requests"])
    for drafter, path in models.drafters.items():
        progress(f"(e) {DRAFTER_LABELS[drafter]} F16, trace verbosity")
        spec = serve(drafter, path)
        steps = max(1, spec["tokens"] - spec["requests"] - spec["accepted"])
        draft_ms = spec.get("draft_ms", 0.0) + spec.get("begin_ms", 0.0) + spec.get("accept_ms", 0.0)
        rest = spec["predicted_ms"] - draft_ms
        tau = (spec["tokens"] - spec["requests"]) / steps
        rows.append({
            "drafter": drafter, "target_ms_per_token": round(per_token, 3),
            "target_prompt_ms_per_request": round(alone["prompt_ms"] / alone["requests"], 2),
            "spec_prompt_ms_per_request": round(spec["prompt_ms"] / spec["requests"], 2),
            "steps": steps, "tau": round(tau, 3), "step_ms": round(spec["predicted_ms"] / steps, 3),
            "draft_ms_per_step": round(draft_ms / steps, 3), "verify_ms_per_step": round(rest / steps, 3),
            "draft_share": round(draft_ms / spec["predicted_ms"], 3) if spec["predicted_ms"] else None,
            "step_over_token": round(spec["predicted_ms"] / steps / per_token, 3),
            "verify_over_token": round(rest / steps / per_token, 3),
            "draft_over_token": round(draft_ms / steps / per_token, 3),
            "timers_found": "draft_ms" in spec,
            "block_size": read_draft(path).block_size,
            "bench_ms_per_token": bench.get("tg"),
            "bench_batch_ms": bench.get(read_draft(path).block_size),
        })
        if spec.get("perf"):
            perf_rows.append({"label": f"with {DRAFTER_LABELS[drafter]}", **spec["perf"]})
        r = rows[-1]
        progress(f"(e) -> target {per_token:.2f} ms/token; step {r['step_ms']:.2f} ms = draft "
                 f"{r['draft_ms_per_step']:.2f} + verify/sample {r['verify_ms_per_step']:.2f}, tau {tau:.2f}")
    return rows, perf_rows


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def _md_table(header: list[str], rows: list[list], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _exact(r: dict) -> str:
    """yes; or how many prompts diverged, numerical (the target's own choice in a wider batch, allowed) and
    mismatches apart."""
    if r["exact"]:
        return "yes"
    kinds = r.get("divergences") or []
    ties, other = kinds.count("numerical"), len(kinds) - kinds.count("numerical")
    parts = ([f"{ties} numerical"] if ties else []) + ([f"{other} MISMATCH"] if other else [])
    return ("yes, " if not other else "NO, ") + " + ".join(parts)


def _types(types: dict[str, int]) -> str:
    return ", ".join(f"{k}x{v}" for k, v in sorted(types.items(), key=lambda kv: -kv[1]))


def conversion_table(conv: dict) -> str:
    u, o = conv["upstream"], conv["dflash_gguf"]
    return _md_table(["", "wall s", "peak RSS MiB"], [
        ["upstream `convert_hf_to_gguf.py`", f"{u['seconds']:.2f}", f"{u['peak_mib']:.1f}"],
        ["`dflash-gguf convert`", f"{o['seconds']:.2f}", f"{o['peak_mib']:.1f}"],
        ["ratio (ours / upstream)", f"{conv['time_ratio']:.2f}x", f"{conv['peak_memory_ratio']:.2f}x"]])


def decode_table(rows: list[dict]) -> str:
    return _md_table(
        ["drafter", "type", "MiB", "-np", "exact", "tau", "acceptance", "target tok/s", "spec tok/s",
         "speedup (range)"],
        [[DRAFTER_LABELS[r["drafter"]], r["type"], f"{r['mib']:.2f}", r["parallel"],
          _exact(r), f"{r['tau']:.3f}",
          f"{r['acceptance_rate']:.3f}", f"{r['tps_target']:.1f}", f"{r['tps_speculative']:.1f}",
          _speedup(r)] for r in rows], "lllrlrrrrr")


def _speedup(r: dict) -> str:
    if not r["speedup"]:
        return "-"
    runs = r.get("speedup_runs") or []
    spread = f" ({min(runs):.2f}-{max(runs):.2f})" if len(runs) > 1 else ""
    return f"{r['speedup']:.2f}x{spread}"


def parity_table(rows: list[dict]) -> str:
    return _md_table(
        ["drafter (F16, -np 1)", "tau llama.cpp", "tau PyTorch reference", "relative difference",
         "tokens llama.cpp / reference", "prompts of equal length"],
        [[DRAFTER_LABELS[r["drafter"]], f"{r['tau_llama']:.3f}", f"{r['tau_reference']:.3f}",
          f"{r['relative_difference']:+.1%}" if r["relative_difference"] is not None else "-",
          f"{r['tokens_llama']} / {r['tokens_reference']}", f"{r['prompts_same_length']} / {r['prompts']}"]
         for r in rows])


def recipe_table(rows: list[dict]) -> str:
    return _md_table(
        ["drafter", "type", "recipe", "MiB", "tau", "acceptance", "tau per MiB", "exact", "tensor types"],
        [[DRAFTER_LABELS[r["drafter"]], r["type"], r["recipe"], f"{r['mib']:.2f}", f"{r['tau']:.3f}",
          f"{r['acceptance_rate']:.3f}", f"{r['tau_per_mib']:.3f}", _exact(r),
          _types(r["types"])] for r in rows], "lllrrrrll")


def profile_table(rows: list[dict]) -> str:
    def ms(v):
        return f"{v:.2f}" if isinstance(v, (int, float)) else "-"

    return _md_table(
        ["drafter (F16, -np 1)", "server: target ms/token", "tau", "step ms", "draft ms/step",
         "verify+sample ms/step", "step / target token", "draft share", "llama-bench: ms/token, ms/batch of B"],
        [[DRAFTER_LABELS[r["drafter"]], ms(r["target_ms_per_token"]), f"{r['tau']:.2f}", ms(r["step_ms"]),
          ms(r["draft_ms_per_step"]), ms(r["verify_ms_per_step"]), f"{r['step_over_token']:.2f}x",
          f"{r['draft_share']:.0%}" if r["draft_share"] is not None else "-",
          f"{ms(r.get('bench_ms_per_token'))}, {ms(r.get('bench_batch_ms'))} (B={r.get('block_size')})"]
         for r in rows])


def perf_table(rows: list[dict]) -> str:
    groups = [name for name, _ in PERF_GROUPS] + ["other"]
    return _md_table(["server"] + groups, [[r["label"]] + [f"{r.get(g, 0.0):.1f} %" for g in groups] for r in rows])


def render_chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    decode, recipes, parity = results["decode"], results["recipes"], results["parity"]
    shades = {("dflash", 0): "#1f77b4", ("dflash", 1): "#7fb2dc", ("dflash", 2): "#c6dcef",
              ("dflash2", 0): "#d62728", ("dflash2", 1): "#e8797a", ("dflash2", 2): "#f4c2c2",
              ("dspark", 0): "#2ca02c", ("dspark", 1): "#7fcc7f", ("dspark", 2): "#c5e8c5"}
    fig, axes = plt.subplots(2, 2, figsize=(15, 9))

    def grouped(ax, groups, series, value, width=0.8):
        """Bars: one group per x label, one bar per series; returns {(group, series): x}."""
        xs, n = {}, len(series)
        for j, (key, label, color) in enumerate(series):
            pos, vals = [], []
            for i, g in enumerate(groups):
                v = value(g, key)
                if v is None:
                    continue
                x = i - width / 2 + (j + 0.5) * width / n
                xs[(g, key)] = x
                pos.append(x)
                vals.append(v)
            ax.bar(pos, vals, width / n, label=label, color=color)
        ax.set_xticks(range(len(groups)), groups)
        return xs

    by = {(r["drafter"], r["type"], r["parallel"]): r for r in decode}
    drafters = list(dict.fromkeys(r["drafter"] for r in decode))
    series = [((d, p), f"{DRAFTER_LABELS[d]} -np {p}", shades[(d, k)])
              for d in drafters for k, p in enumerate(PARALLEL)]

    ax = axes[0][0]
    xs = grouped(ax, list(DECODE_TYPES), series,
                 lambda t, k: (by.get((k[0], t, k[1])) or {}).get("speedup"))
    for (t, k), x in xs.items():
        r = by[(k[0], t, k[1])]
        ax.text(x, r["speedup"], f"{r['speedup']:.2f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_ylim(0, max([1.1] + [(r["speedup"] or 0) * 1.3 for r in decode]))
    ax.set_ylabel("speedup (tokens/s with drafter / target alone)")
    ax.set_title(f"(b) speedup, patched CPU llama-server, {results['settings']['n_predict']} new tokens")
    ax.legend(fontsize=8, ncol=2, loc="upper left")

    ax = axes[0][1]
    xs = grouped(ax, list(DECODE_TYPES), series, lambda t, k: (by.get((k[0], t, k[1])) or {}).get("tau"))
    for p in parity:
        x = xs.get(("F16", (p["drafter"], 1)))
        if x is not None:
            ax.plot([x - 0.12, x + 0.12], [p["tau_reference"]] * 2, color="black", lw=2.5)
            ax.text(x, p["tau_reference"], f"ref {p['tau_reference']:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("tau (tokens per target verification step)")
    ax.set_title("(b, c) acceptance length; black bar: PyTorch reference (F16, -np 1)")
    ax.set_ylim(0, max([1.0] + [r["tau"] * 1.3 for r in decode]))
    ax.legend(fontsize=8, ncol=2, loc="upper right")

    types = list(RECIPE_TYPES) + ["F16"]
    rby = {(r["drafter"], r["type"], r["recipe"]): r for r in recipes}
    rdrafters = list(dict.fromkeys(r["drafter"] for r in recipes))
    rseries = [((d, rec), f"{DRAFTER_LABELS[d]} {rec}", shades[(d, k)])
               for d in rdrafters for k, rec in enumerate(RECIPES)]

    def recipe_value(field):
        def value(t, k):
            r = rby.get((k[0], t, k[1])) or (rby.get((k[0], t, "-")) if t == "F16" and k[1] == "plain" else None)
            return r[field] if r else None
        return value

    ax = axes[1][0]
    grouped(ax, types, rseries, recipe_value("tau"))
    ax.set_ylabel("tau")
    lo = min((r["tau"] for r in recipes), default=1.0)
    hi = max((r["tau"] for r in recipes), default=1.0)
    ax.set_ylim(max(0.0, lo - 0.5), hi + 0.4 * (hi - lo + 0.5))
    ax.set_title(f"(d) tau by type and recipe (-np 1, {results['settings']['recipe_n_predict']} new tokens; "
                 "F16: the conversion)", fontsize=10)
    ax.legend(fontsize=7, ncol=2)

    ax = axes[1][1]
    grouped(ax, types, rseries, recipe_value("tau_per_mib"))
    ax.set_ylabel("tau per MiB of drafter file")
    ax.set_ylim(0, max([0.1] + [r["tau_per_mib"] * 1.3 for r in recipes]))
    ax.set_title("(d) acceptance length per MiB", fontsize=10)
    ax.legend(fontsize=7, ncol=2)

    m = results["machine"]
    fig.suptitle(f"dflash-gguf benchmarks: {results['models']} pair, {m['cpu']} x {m['nproc']}, {m['date']}, "
                 f"llama build {results['llama_build']}", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def render_markdown(results: dict, png_name: str) -> str:
    m, s = results["machine"], results["settings"]
    load0, load1 = results["load"]["start"], results["load"]["end"]
    trained = results["models"] == "trained"
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `make bench` (`benchmarks/bench.py`) on {m['date']}, in one run of "
        f"{results['run_seconds'] / 60:.1f} minutes. Every speed figure below is a ratio of two things "
        "measured side by side in that run; absolute times depend on the machine and its load.",
        "",
        "## Machine and build",
        "",
        f"- CPU: {m['cpu']}, `nproc` = {m['nproc']}, {m['memory_gib']} GiB memory, {m['os']}, Python {m['python']}",
        f"- llama.cpp: the patched pinned tree (llama-cpp-python 0.3.36 sdist + `ggml_patches/series`), "
        f"{results.get('backend', 'cpu').upper()} backend, build key `{results['llama_build']}`",
        f"- load average (1/5/15 min) at the start: {load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f}; "
        f"at the end: {load1[0]:.2f} / {load1[1]:.2f} / {load1[2]:.2f}"
        + (f"; other work was running during the run ({'; '.join(results['load']['busy'])}), so absolute times "
           "are noisy (ratios less so)" if results["load"]["busy"] else ""),
        "- models: " + ("the project's trained pair (`tests/fixtures/trained`, `make train-pair`: a Qwen3 target "
                         "trained on the CPython stdlib and drafters trained on its greedy continuations), "
                         "converted to F16 GGUF by `make fixtures` (`build/fixtures/trained/`)"
                         if trained else "the tiny RANDOM-WEIGHT fixtures (the trained pair was not available): "
                                         "tau and speed mean nothing here") + f": {results['models_description']}",
        f"- prompts: {len(results['prompts'])} " + ("held-out prompts (`build/fixtures/trained/prompts.txt`, "
                                                    "module openings not in the training set)" if trained
                                                    else "built-in prompts") +
        ", greedy (temperature 0), sent as token ids",
        "",
        f"![benchmarks]({png_name})",
        "",
        "## (a) Conversion against the pinned upstream converter",
        "",
    ]
    conv = results.get("conversion")
    if conv:
        lines += [f"A {conv['drafter_bytes'] / 2**30:.2f} GiB bf16 drafter with the geometry of a Qwen3-8B DFlash "
                  f"b16 checkpoint ({conv['geometry']}; seeded random weights generated once under the cache), "
                  "converted by each, one after the other (`benchmarks/bench_convert.py`'s measurement: wall time "
                  "and peak RSS of the child process).", "", conversion_table(conv), "",
                  f"Identical output (metadata values and types, tensor bytes): "
                  f"{'yes' if conv['identical_output'] else 'NO: ' + '; '.join(conv['differences'])}.", ""]
    else:
        lines += ["(skipped in this run)", ""]
    lines += [
        "## (b) Decoding: target alone against "
        + ", ".join(DRAFTER_LABELS[d] for d in dict.fromkeys(r["drafter"] for r in results["decode"])),
        "",
        f"`dflash-gguf validate` for each drafter and type, {s['n_predict']} new tokens per prompt, -np 1 and 4. "
        f"Q8_0 and Q4_K_M are quantized from the F16 conversion with the default recipe (`{DEFAULT_RECIPE}`: "
        f"{RECIPE_TABLE[DEFAULT_RECIPE].description}). *exact*: every prompt's tokens equal the target's own. "
        "*tau*: tokens per target verification step, bonus token included, each request's prefill token left "
        "out. *acceptance*: accepted / drafted tokens. Tokens/s are from one-prompt-at-a-time passes of the "
        "target alone and of the target with the drafter, in the same `validate` run (so even at -np 4 they "
        "are single-stream speeds; -np 4 changes what tau and exactness are measured under). Each "
        f"configuration was validated {s.get('repeats', 1)} times: exactness over all runs, tau and acceptance of "
        "the first, tokens/s of the run with the median speedup, and the range of the runs' speedups.",
        "",
        decode_table(results["decode"]),
        "",
    ]
    notes = results.get("notes") or []
    lines += ["## (c) tau in llama.cpp beside the PyTorch reference", "",
              "The z-lab reference (`dflash==0.1.0`, `dflash_generate`, float32) on the same token ids, "
              f"{s['n_predict']} new tokens, greedy; goal: within 5 %.", ""]
    lines += [parity_table(results["parity"]) if results["parity"] else "(not run)", ""]
    lines += [
        "## (d) Quantization recipes: acceptance length per MiB (issue 5)",
        "",
        "Each drafter quantized from its F16 conversion with each type and recipe ("
        + "; ".join(f"`{r.name}`: {r.description}" for r in RECIPE_TABLE.values()) + "), then "
        f"`validate -np 1` with {s['recipe_n_predict']} new tokens per prompt (fewer than in (b), to keep the "
        "run short, so tau differs slightly from (b)). *tau per MiB* = tau / file MiB. *tensor types*: what the "
        "file holds (norms and DFlash 2's conv base kernels stay F32).",
        "",
        recipe_table(results["recipes"]),
        "",
    ]
    if results.get("profile"):
        lines += [
            "## (e) Where a speculative step's time goes",
            "",
            f"The target alone and the target with each F16 drafter, one prompt at a time (every prompt "
            f"{s.get('profile_rounds', 1)} times), {s['n_predict']} new tokens, llama-server at `-lv 4`: *draft ms/step* is the drafter's own timers (llama.cpp's "
            "`common_speculative` begin + draft + accept, printed in its `statistics` trace line); "
            "*verify+sample* is the rest of the server's generation time per step (the target's batched "
            "verification of the draft, sampling, bookkeeping). *step / target token*: how many of the target's "
            "own single-token decodes one speculative step costs; the speedup is about tau divided by it. "
            "The last column is `llama-bench` on the target alone (no server): one decoded token, and one "
            "batch of B tokens (B = the drafter's block, what a verification step evaluates).",
            "",
            profile_table(results["profile"]),
            "",
        ]
        if results.get("perf"):
            lines += [
                "Where the CPU samples fall (`perf record -F 999` on the llama-server process during one more, "
                "untimed round of the prompts; `perf report --sort dso,sym`), grouped by what the symbols do (`PERF_GROUPS` in benchmarks/bench.py):",
                "",
                perf_table(results["perf"]),
                "",
            ]
    if results.get("regimes"):
        lines += regimes.markdown(results["regimes"], DRAFTER_LABELS)
    if results.get("real"):
        lines += real_target.markdown(results["real"]) + [""]
    if notes:
        lines += ["## Observations", ""] + [f"- {n}" for n in notes] + [""]
    lines += [
        "## Reproduce",
        "",
        "```sh",
        "make bench                     # = make llama fixtures, then .venv/bin/python -m benchmarks.bench",
        "# single pieces, by hand:",
        "make bench-convert             # (a) alone",
        "python -m benchmarks.concurrency   # (h) alone: docs/benchmarks-concurrency.md",
        "python -m benchmarks.memory_bound build/fixtures/trained/target.gguf build/bench/wide.gguf --mib 457",
        "dflash-gguf validate -t build/bench/wide.gguf -d build/fixtures/trained/dflash.gguf \\",
        "    --prompts build/fixtures/trained/prompts.txt --baseline build/fixtures/trained/target.gguf -- --load-mode none",
        "dflash-gguf validate --target build/fixtures/trained/target.gguf --draft build/fixtures/trained/dflash2.gguf \\",
        f"    --prompts build/fixtures/trained/prompts.txt -n {s['n_predict']} --parallel 1 \\",
        "    --reference-draft tests/fixtures/trained/dflash2 --reference-target tests/fixtures/trained/target --json",
        "dflash-gguf quantize build/fixtures/trained/dflash2.gguf build/bench/dflash2-Q4_K_M.gguf --type Q4_K_M",
        "dflash-gguf validate --target build/fixtures/trained/target.gguf --draft build/bench/dflash2-Q4_K_M.gguf \\",
        f"    --prompts build/fixtures/trained/prompts.txt -n {s['recipe_n_predict']} --parallel 1",
        "```",
        "",
        "The raw numbers of this run are in `build/bench/results.json`.",
        "",
    ]
    if results.get("concurrency"):
        lines[-4:-4] = ["Section (h), speedup against concurrency, is on its own page: "
                        "[benchmarks-concurrency.md](benchmarks-concurrency.md).", ""]
    return "\n".join(lines)


def observations(results: dict) -> list[str]:
    notes = []
    by = {(r["drafter"], r["type"], r["parallel"]): r for r in results["decode"]}
    for (d, t, p), r in by.items():
        if p == 1 and (d, t, 4) in by:
            r4 = by[(d, t, 4)]
            if r4["tau"] < r["tau"]:
                drop = (r4["tau"] - r["tau"]) / r["tau"]
                notes.append(f"{DRAFTER_LABELS[d]} {t}: tau {r['tau']:.3f} at -np 1 but {r4['tau']:.3f} at -np 4 "
                             f"({drop:+.1%}), acceptance {r['acceptance_rate']:.3f} -> {r4['acceptance_rate']:.3f}"
                             + (": acceptance dropping with parallel slots, llama.cpp #27117." if drop < -0.02 else
                                ": a small drop with 4 slots (the direction llama.cpp #27117 reports; here "
                                "within 2 %)."))
    ties_b, ties_d, where_tie = [], 0, {}
    for r in results["decode"] + results["recipes"]:
        if r["exact"]:
            continue
        where = f"{DRAFTER_LABELS[r['drafter']]} {r['type']} " + (
            f"-np {r['parallel']}" if "parallel" in r else f"{r['recipe']} (d)")
        if all(k == "numerical" for k in r["divergences"]):
            if "parallel" in r:
                ties_b.append(where)
            else:
                ties_d += 1
            for d in r.get("divergence_at") or []:
                key = (d["prompt"], d["position"])
                where_tie[key] = min(where_tie.get(key, 1e9), d["margin"] if d["margin"] is not None else 1e9)
        else:
            notes.append(f"{where}: NOT lossless, divergences {', '.join(r['divergences'])}.")
    if ties_b or ties_d:
        at = "; ".join(f"{prompt!r}... at new token {pos} (margin to the argmax {m:.2g})" for (prompt, pos), m in where_tie.items())
        notes.append(
            f"Ties, no mismatch: in (b) {len(ties_b)} of {len(results['decode'])} configurations "
            f"({', '.join(ties_b) or 'none'}) and in (d) {ties_d} of {len(results['recipes'])} had a prompt "
            f"diverge where the target's top-2 logits are within the tie tolerance (batched verification is "
            f"not bit-identical to single-token decoding): {at or 'see results.json'}.")
    prof = {r["drafter"]: r for r in results.get("profile") or []}
    for (d, t, p), r in by.items():
        if t != "F16" or p != 1 or not r["speedup"] or drafting_pays(r["speedup"]) or d not in prof:
            continue
        e = prof[d]
        bench_ratio = (e["bench_batch_ms"] / e["bench_ms_per_token"]
                       if e.get("bench_batch_ms") and e.get("bench_ms_per_token") else None)
        notes.append(
            f"{DRAFTER_LABELS[d]} F16: {speed_verdict(r['speedup'], where='')} although tau is {r['tau']:.2f}: in "
            f"(e) one speculative step costs {e['step_over_token']:.1f} of the target's own decoded tokens "
            f"({e['draft_ms_per_step']:.2f} ms drafting + {e['verify_ms_per_step']:.2f} ms verifying and sampling, "
            f"against {e['target_ms_per_token']:.2f} ms per token alone), so tau / cost = "
            f"{e['tau'] / e['step_over_token']:.2f}."
            + (f" llama-bench on the {results.get('target_mib', '?')} MiB target: "
               f"{batch_cost_verdict(bench_ratio, e['block_size'])}." if bench_ratio else ""))
    for p in results["parity"]:
        if p["relative_difference"] is not None and abs(p["relative_difference"]) > 0.05:
            notes.append(f"{DRAFTER_LABELS[p['drafter']]}: llama.cpp tau {p['tau_llama']:.3f} is "
                         f"{p['relative_difference']:+.1%} from the reference's {p['tau_reference']:.3f} "
                         "(goal: within 5 %).")
    return notes


def print_tables(results: dict) -> None:
    print()
    if results.get("conversion"):
        print("(a) conversion\n" + conversion_table(results["conversion"]) + "\n")
    print("(b) decode\n" + decode_table(results["decode"]) + "\n")
    if results["parity"]:
        print("(c) reference parity\n" + parity_table(results["parity"]) + "\n")
    print("(d) recipes\n" + recipe_table(results["recipes"]) + "\n")
    if results.get("profile"):
        print("(e) profile\n" + profile_table(results["profile"]) + "\n")
    if results.get("perf"):
        print("(e) perf samples by kind of work\n" + perf_table(results["perf"]) + "\n")
    if results.get("regimes"):
        print("(f) regimes\n" + regimes.regime_table(results["regimes"], DRAFTER_LABELS) + "\n")
        print("(f) steps\n" + regimes.step_table(results["regimes"], DRAFTER_LABELS) + "\n")
    for n in results.get("notes") or []:
        print("note: " + n)


# the public suites' section (`dflash-gguf bench --suite`, measured by hand): kept across `make bench`
SUITES_BEGIN = "<!-- public suites: `dflash-gguf bench --suite`, run by hand (validation/suites.py) -->"
SUITES_END = "<!-- end of public suites -->"


def kept_suites(page: Path) -> str:
    """The public suites' section of the page as it is, to append to the rewritten page ("" if none)."""
    text = page.read_text(encoding="utf-8") if page.is_file() else ""
    if SUITES_BEGIN not in text or SUITES_END not in text:
        return ""
    return "\n" + SUITES_BEGIN + text.split(SUITES_BEGIN, 1)[1].split(SUITES_END, 1)[0] + SUITES_END + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="random-weight fixtures, few tokens, no conversion section: exercise the script")
    parser.add_argument("-n", "--n-predict", type=int, default=None, help="new tokens per prompt in (b) (128)")
    parser.add_argument("--recipe-n-predict", type=int, default=None, help="new tokens per prompt in (d) (64)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="validate runs per configuration in (b); the median speedup is reported (5)")
    parser.add_argument("--skip-convert", action="store_true", help="leave out section (a)")
    parser.add_argument("--no-reference", action="store_true", help="leave out section (c)")
    parser.add_argument("--skip-regimes", action="store_true", help="leave out section (f)")
    parser.add_argument("--skip-real", action="store_true", help="leave out section (g) (--quick leaves it out too)")
    parser.add_argument("--skip-concurrency", action="store_true", help="leave out section (h)")
    parser.add_argument("--backend", choices=("cpu", "cuda", "metal"), default=None,
                        help="the llama.cpp build to measure (default: the default backend's, as `llama build`)")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where benchmarks.md and benchmarks.png go")
    parser.add_argument("--json", type=Path, default=None, help="raw results (default build/bench/results.json)")
    args = parser.parse_args(argv)
    global BACKEND
    from dflash_gguf.runner.build import default_backend, find_bin_dir

    BACKEND = args.backend or default_backend()

    n_predict = args.n_predict or (16 if args.quick else 128)
    recipe_n = args.recipe_n_predict or (8 if args.quick else 64)
    busy = training_running()
    load_start = load_average()
    progress(f"load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}"
             + (f"; training running: {len(busy)} process(es)" if busy else ""))
    results: dict = {"machine": machine_info(), "backend": BACKEND,
                     "settings": {"n_predict": n_predict, "recipe_n_predict": recipe_n, "quick": args.quick}}

    if args.quick or args.skip_convert:
        results["conversion"] = None
    else:
        results["conversion"] = conversion_section()

    if not args.quick and trained_pair_ready():
        progress("models: the trained pair (make fixtures converts it to build/fixtures/trained)")
        models = trained_models()
    else:
        progress("models: the random-weight fixtures" + ("" if args.quick else " (the trained pair is not there)"))
        models = random_models()
    if args.quick:
        models.prompts = models.prompts[:2]
    results["models"], results["prompts"] = models.kind, models.prompts
    results["models_description"] = describe_models(models)
    results["target_mib"] = round(models.target.stat().st_size / 2**20, 1)

    repeats = args.repeats or (1 if args.quick else 5)
    results["settings"]["repeats"] = repeats
    results["decode"], results["parity"], results["llama_build"] = decode_section(
        models, n_predict, not args.no_reference, repeats)
    results["recipes"] = recipe_section(models, recipe_n)
    results["settings"]["profile_rounds"] = 1 if args.quick else 3
    results["profile"], results["perf"] = profile_section(models, n_predict, results["settings"]["profile_rounds"])
    if args.skip_regimes:
        results["regimes"] = None
    else:
        results["regimes"] = regimes.regime_section(
            models, n_predict, 1 if args.quick else 3, WORK / models.kind / "regimes", _row,
            lambda m: profile_section(m, n_predict, results["settings"]["profile_rounds"]), progress, BACKEND,
            lambda target, batches: _llama_bench(target, find_bin_dir(BACKEND), batches))
    results["real"] = None if args.quick or args.skip_real else real_target.real_section(
        lambda m: progress(m), BACKEND, repeats=1 if args.quick else 3)
    if args.skip_concurrency:
        results["concurrency"] = None
    else:
        from benchmarks import concurrency

        results["concurrency"] = concurrency.concurrency_section(args.quick, BACKEND, progress)
    busy += [b for b in training_running() if b not in busy]
    results["load"] = {"start": load_start, "end": load_average(), "busy": busy}
    results["run_seconds"] = round(time.perf_counter() - _T0, 1)
    results["notes"] = observations(results)

    out_json = args.json or (WORK / "results.json")
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(results, indent=2, default=str))
    args.docs.mkdir(parents=True, exist_ok=True)
    render_chart(results, args.docs / "benchmarks.png")
    if results["real"]:
        real_target.chart(results["real"], args.docs / real_target.PNG)
    page = args.docs / "benchmarks.md"
    page.write_text(render_markdown(results, "benchmarks.png") + kept_suites(page))
    if results["concurrency"]:
        concurrency.write(results["concurrency"], args.docs, results["machine"], results["load"], "make bench")
    print_tables(results)
    progress(f"wrote {args.docs / 'benchmarks.md'}, {args.docs / 'benchmarks.png'}, {out_json} "
             f"in {results['run_seconds'] / 60:.1f} min")


if __name__ == "__main__":
    main()
