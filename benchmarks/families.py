"""`make families`: docs/families.md, the target-family matrix.

For every family of training/fixtures/toys.py and each drafter variant (DFlash, DFlash 2), on the zoo
that `make fixtures` lays out (training/fixtures/families.py), F16 target, the zoo's held-out prompts,
greedy, N_PREDICT tokens, llama-server -t 1:

    converts          the pinned upstream converter made the target, dflash-gguf convert the drafter
    drafter           trained by `dflash-gguf train` for this target (training/train_zoo.py; its held-out
                      tau on 20 chat prompts, measured by train) or untrained, and why
    loads patched     the patched llama-server (the launch recipe) loads the pair and drafts; whether its
                      output equals the target alone's; drafted / accepted
    loads stock       the same in stock llama.cpp (PyPI xllamacpp, training/fixtures/xllamacpp_server.py), its
                      drafted / accepted beside the patched build's
    lossless          no emitted token differs from the target's argmax in its verify batch
    proven / produced tokens replayed bit-exactly against tokens emitted (validate's JSON:
                      `proven_by_replay` where the report has it, else `positions_checked`)
    --exact identical `validate --exact`: speculative output token-identical to the target alone
    draft parity      `validate --reference-draft/--reference-target` on the zoo's HF folders: the share of
                      steps whose first drafted token and whole block equal the z-lab PyTorch
                      reference's at the same context, and the steps that differ beyond the F16 noise
                      (yes: first position >= 95 %, none beyond the noise)
    tau, tokens/s     validate's mean acceptance length and speculative tokens per second
    draft tree        `validate --exact -- --spec-tree-budget 8` (patch 0009): every token proven by the
                      replay of the tree batches, identical to the target alone, and tau; or the chain,
                      with the server's reason, where the family cannot use a tree
    draft length auto `validate --exact -- --spec-draft-n-max auto` (patch 0008): the controller's run
                      proven token by token, identical to the target alone, its tau and parked share

A cell that could not be measured holds the reason (the first error line). The page is written when
every family is measured; an interrupted run leaves what it measured in build/families/families.md.

    .venv/bin/python -m benchmarks.families [ARCH ...] [--only tree|auto]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.bench import machine_info
from dflash_gguf.errors import DflashError
from dflash_gguf.runner import build
from training.fixtures.families import OUT, STATUS, family_folder, last_error_line, trained_record
from training.fixtures.toys import FAMILIES
from training.fixtures.family_drafters import VARIANTS
from training.fixtures.xllamacpp_server import Run, run_prompts

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "families.md"
WORK = REPO / "build" / "families"
N_PREDICT = 24
PROMPTS = 2
THREADS = 1
TREE_BUDGET = 8
LABELS = {"dflash": "DFlash", "dflash2": "DFlash 2"}


def validate(folder: Path, variant: str, work: Path, *extra: str) -> tuple[dict | None, str]:
    """`dflash-gguf validate` on the family's pair: (report or None, why there is none)."""
    prompts = work / "prompts.jsonl"  # chat turns, as the zoo's drafters were trained
    prompts.write_text("".join((folder / "prompts.jsonl").read_text().splitlines(keepends=True)[:PROMPTS]))
    report = work / f"{variant}{'-'.join(('',) + tuple(a.strip('-') for a in extra if a.startswith('--')))}.json"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "dflash_gguf.cli", "validate", "--target", str(folder / "target-F16.gguf"),
           "--draft", str(folder / f"{variant}.gguf"), "--prompts", str(prompts), "-n", str(N_PREDICT),
           "--threads", str(THREADS), "--report", str(report), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if not report.is_file():
        return None, last_error_line(proc.stderr or proc.stdout)
    return json.loads(report.read_text()), ""


def stock_bin(work: Path) -> Path | str:
    try:
        import xllamacpp  # noqa: F401
    except ImportError:
        return "xllamacpp not installed (pip install -e '.[test-stock]')"
    from training.fixtures.xllamacpp_server import shim_folder

    return shim_folder(work / "stock-bin")


_ALONE: dict[tuple[Path, Path], Run] = {}


def _runs(bin_dir: Path, folder: Path, variant: str, work: Path, label: str) -> tuple[Run, Run]:
    """(target alone, with the drafter) on `bin_dir`'s llama-server: the launch recipe, greedy, the
    family's first prompts (the target alone once per build and family)."""
    prompts = (folder / "prompts.txt").read_text().splitlines()[:PROMPTS]
    target = folder / "target-F16.gguf"
    if (bin_dir, target) not in _ALONE:
        _ALONE[bin_dir, target] = run_prompts(bin_dir, target, None, prompts, N_PREDICT, work / f"{label}-alone.log")
    spec = run_prompts(bin_dir, target, folder / f"{variant}.gguf", prompts, N_PREDICT, work / f"{label}-{variant}.log")
    return _ALONE[bin_dir, target], spec


def server_cell(bin_dir: Path, folder: Path, variant: str, work: Path, label: str,
                compare: Run | None = None) -> tuple[str, Run | None]:
    """Whether the build loads the pair and drafts, its output against its own target alone, and the
    drafted / accepted counts (beside `compare`'s, another build's run, when given)."""
    try:
        alone, spec = _runs(bin_dir, folder, variant, work, label)
    except DflashError as exc:
        return f"no: {str(exc).splitlines()[0]}", None
    cell = (f"yes, {'output = target alone' if spec.tokens == alone.tokens else 'output differs from target alone'}"
            f", drafted {spec.drafted}, accepted {spec.accepted}")
    if compare is not None:
        same = (compare.drafted, compare.accepted) == (spec.drafted, spec.accepted)
        cell += " (as patched)" if same else f" (patched: {compare.drafted} / {compare.accepted})"
    return cell, spec


def _yes(ok: bool, why: str = "") -> str:
    return "yes" if ok else (f"no: {why}" if why else "no")


def row(arch: str, variant: str, folder: Path, stock: Path | str) -> dict:
    status = json.loads((folder / STATUS).read_text())
    work = WORK / arch
    work.mkdir(parents=True, exist_ok=True)
    cells = {"family": arch, "variant": LABELS[variant]}
    made = str(status.get(variant))
    converted = status.get("F16") == "converted" and (made == "converted" or made.startswith("untrained"))
    cells["converts"] = _yes(converted, status.get(variant) if status.get("F16") == "converted"
                             else status.get("F16") or status.get("hf"))
    if not converted:
        return cells
    record = trained_record(arch, variant)
    cells["drafter"] = (f"trained, {record['steps']} steps: held-out tau {record['held_out']['tau']:.2f}"
                        if made == "converted" and record else made)
    cells["loads patched"], patched = server_cell(build.find_bin_dir("cpu"), folder, variant, work, "patched")
    if isinstance(stock, Path):
        cells["loads stock"], _ = server_cell(stock, folder, variant, work, "stock", patched)
    else:
        cells["loads stock"] = f"not run: {stock}"
    reference = ("--reference-draft", str(folder / f"{variant}-hf"), "--reference-target", str(folder / "hf"))
    report, why = validate(folder, variant, work, "--backend", "cpu", *reference)
    cells["draft parity"] = parity_cell(report, why)
    if report is None:  # the reference could not run: the rest is measured without it
        report, why = validate(folder, variant, work, "--backend", "cpu")
    if report is None:
        cells["lossless"] = f"no report: {why}"
    else:
        mismatches = sum(d["kind"] == "mismatch" for d in report["divergences"])
        cells["lossless"] = _yes(report["lossless"], f"{mismatches} mismatches")
        proven = report.get("proven_by_replay", report.get("positions_checked"))
        cells["proven / produced"] = f"{proven} / {report['produced']}"
        cells["tau"] = f"{report['mean_acceptance_length']:.2f}"
        cells["acceptance"] = f"{report['acceptance_rate']:.2f}"
        cells["tokens/s"] = f"{report['tokens_per_second']['speculative']:.0f}"
    exact, why = validate(folder, variant, work, "--backend", "cpu", "--exact")
    cells["identical under --exact"] = _yes(exact is not None and exact["exact"], why)
    for column, (args, cell) in COLUMN_RUNS.items():
        report, why = validate(folder, variant, work, "--backend", "cpu", "--exact", *args)
        cells[column] = cell(report, why)
    return cells


def auto_cell(report: dict | None, why: str) -> str:
    """The draft-length controller under --exact: proven and identical, with the share of parked steps."""
    if report is None:
        return f"no report: {why}"
    ok = report["lossless"] and report["exact"] and report["proven_by_replay"] == report["produced"]
    parked = report["drafting"].get("parked_share")
    parked = f", parked {parked:.0%} of {report['drafting']['steps']} steps" if parked is not None else ""
    return (f"{'yes' if ok else 'no'}: proven {report['proven_by_replay']} / {report['produced']}, identical "
            f"{_yes(report['exact'])}, tau {report['mean_acceptance_length']:.2f}{parked}")


def tree_cell(report: dict | None, why: str) -> str:
    """A tree run under --exact: proven and identical, with its tau; or the chain and the server's reason."""
    if report is None:
        return f"no report: {why}"
    state = report["replay"].get("tree") or {}
    proven = f"proven {report['proven_by_replay']} / {report['produced']}"
    if "off" in state:
        return f"chain ({state['off']}): {proven}, identical {_yes(report['exact'])}"
    ok = report["lossless"] and report["exact"] and report["proven_by_replay"] == report["produced"]
    return (f"{'yes' if ok else 'no'}, {report['replay']['tree_steps']} tree steps: {proven}, identical "
            f"{_yes(report['exact'])}, tau {report['mean_acceptance_length']:.2f}")


# the columns made by one more `validate --exact` run each: what follows --exact, and how the report reads
COLUMN_RUNS = {"draft tree": (["--", "--spec-tree-budget", str(TREE_BUDGET)], tree_cell),
               "draft length auto": (["--", "--spec-draft-n-max", "auto"], auto_cell)}
ONLY = {"tree": "draft tree", "auto": "draft length auto"}


def parity_cell(report: dict | None, why: str) -> str:
    """llama.cpp's drafts against the z-lab PyTorch reference's at the same context, step by step."""
    parity = (report or {}).get("reference", {}) or {}
    parity = parity.get("draft_parity")
    if not parity:
        return f"not measured: {why}" if why else "not measured"
    cell = (f"first {parity['first_position_equal']:.0%}, block {parity['block_equal']:.0%} of {parity['steps']} "
            f"steps; {parity['systematic']} beyond the F16 noise {parity['noise_f16_vs_f32']:.3g}")
    return ("yes, " if parity["systematic"] == 0 and parity["first_position_equal"] >= 0.95 else "no, ") + cell


COLUMNS = ("family", "variant", "converts", "drafter", "loads patched", "loads stock", "lossless", "proven / produced",
           "identical under --exact", "draft parity", "tau", "acceptance", "tokens/s", "draft tree",
           "draft length auto")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_doc(rows: list[dict], seconds: float, command: str, doc: Path = DOC) -> None:
    machine = machine_info()
    bin_dir = build.find_build("cpu")
    lines = [
        "# Target families",
        "",
        "Generated by `make families` (benchmarks/families.py); do not edit by hand. The tiny random-weight",
        "target of each family (training/fixtures/families.py, its table training/fixtures/toys.py) with its",
        "DFlash and DFlash 2 drafters (the published drafters' geometry for the family, trained by `dflash-gguf",
        "train` on the target's own answers: `make train-zoo`, docs/train.md), F16, greedy, "
        f"{PROMPTS} held-out prompts x {N_PREDICT} tokens, llama-server -t {THREADS}.",
        "",
        f"- command: `{command}` ({seconds / 60:.1f} min)",
        f"- build: {build.build_info(bin_dir, 'cpu')['build'] if bin_dir else 'none'} (patched, CPU)",
        f"- machine: {machine.get('cpu', 'unknown')}, {machine['nproc']} cores, "
        f"{machine.get('os', '')}, load average {os.getloadavg()[0]:.1f} (other jobs share it), "
        f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for cells in rows:
        lines.append("| " + " | ".join(_cell(cells.get(c, "")) for c in COLUMNS) + " |")
    limits = [(arch, fam.limitation) for arch, fam in FAMILIES.items() if fam.limitation]
    if limits:
        lines += ["", "## Limitations", ""] + [f"- `{arch}`: {why}" for arch, why in limits]
    doc.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archs", nargs="*", metavar="ARCH", help=f"families (default all: {', '.join(FAMILIES)})")
    parser.add_argument("--only", choices=sorted(ONLY),
                        help="measure only the `draft tree` or the `draft length auto` column and print it as a "
                             "table (the page is kept)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.archs) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families: {', '.join(unknown)}")
    if args.only:
        return only_column(args.archs or list(FAMILIES), ONLY[args.only])
    started = time.time()
    archs = args.archs or list(FAMILIES)
    WORK.mkdir(parents=True, exist_ok=True)
    stock = stock_bin(WORK)
    command = "make families" + (f" ({' '.join(args.archs)})" if args.archs else "")
    rows = []
    for i, arch in enumerate(archs):
        folder = family_folder(arch, OUT)
        for variant in VARIANTS:
            rows.append(row(arch, variant, folder, stock))
            print(json.dumps(rows[-1]), flush=True)
        # an interrupted run still says what it measured, without replacing the last complete page
        write_doc(rows, time.time() - started, f"{command}; stopped after {i + 1} of {len(archs)} families",
                  WORK / "families.md")
    write_doc(rows, time.time() - started, command)
    print(DOC)
    return 0


def only_column(archs: list[str], column: str) -> int:
    """One column's runs alone, for each family and variant, as markdown on stdout."""
    started = time.time()
    args, cell = COLUMN_RUNS[column]
    print(f"| family | variant | {column} |\n|---|---|---|")
    for arch in archs:
        folder, work = family_folder(arch, OUT), WORK / arch
        work.mkdir(parents=True, exist_ok=True)
        for variant in VARIANTS:
            report, why = validate(folder, variant, work, "--backend", "cpu", "--exact", "--rounds", "1", *args)
            print(f"| {arch} | {LABELS[variant]} | {_cell(cell(report, why))} |", flush=True)
    print(f"\n{time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
