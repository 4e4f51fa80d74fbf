"""PNG charts of what `bench` measured (`--charts DIR`), drawn with matplotlib, an optional extra
(`pip install 'dflash-gguf[charts]'`): the base install draws nothing and imports nothing of it.

    bench-throughput.png            the curve: aggregate tokens/s against streams, target alone and drafter
    bench-acceptance-by-depth.png   the curve: per level, the share of steps accepting each depth
    suites-acceptance-by-depth.png  --suite: per suite, the same share
    suites-accepted-lengths.png     --suite: per suite, the verify steps by tokens emitted (accepted + 1)

Each is drawn from the report's JSON (what `--json` prints), so a chart shows exactly the figures
printed beside it. A chart is replaced only when it is one `bench` drew (its PNG text chunk names the
software), never another file of the same name.
"""

from __future__ import annotations

import os
from pathlib import Path

from dflash_gguf.errors import OutputError
from dflash_gguf.extras import require
from dflash_gguf.outputs import Output, Replace, check_outputs, guard, head, named_for, partial_name

SOFTWARE = "dflash-gguf bench"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CURVE_CHARTS = ("bench-throughput.png", "bench-acceptance-by-depth.png")
SUITE_CHARTS = ("suites-acceptance-by-depth.png", "suites-accepted-lengths.png")


def owned(path: Path) -> bool:
    """A chart this command drew (the PNG's tEXt chunk names the software, within its first bytes)."""
    data = head(path, 4096)
    return data.startswith(PNG_MAGIC) and SOFTWARE.encode() in data


def check(folder: Path, names: tuple[str, ...]) -> list[Path]:
    """Before any work: matplotlib is installed, `folder` can take the charts (made when missing)."""
    require("charts", "--charts")
    if os.path.lexists(folder) and not folder.is_dir():
        raise OutputError(f"--charts {folder}: is not a folder; give a folder for the charts")
    paths = [folder / name for name in names]
    if folder.is_dir():
        check_outputs([Output(p, "--charts", Replace.OWNED, owned=owned, what="chart") for p in paths], [])
    return paths


def _save(fig, out: Path) -> None:
    """Write the figure whole or not at all (a temporary file renamed into place)."""
    # extra: [charts] (matplotlib)
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_name(out)
    try:
        guard(out, "--charts")
        fig.savefig(tmp, format="png", dpi=110, metadata={"Software": SOFTWARE})
        os.replace(tmp, out)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise named_for(err, out) from None
    finally:
        tmp.unlink(missing_ok=True)
        plt.close(fig)


def _figure(title: str, xlabel: str, ylabel: str):
    # extra: [charts] (matplotlib)
    import matplotlib

    matplotlib.use("Agg")  # no display needed, never a window
    # extra: [charts] (matplotlib)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _depth_lines(ax, series: list[tuple[str, list[dict]]]) -> None:
    for label, depths in series:
        points = [(d["depth"], d["rate"]) for d in depths if d.get("rate") is not None]
        if points:
            ax.plot(*zip(*points), marker="o", label=label)
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)


def curve_charts(report: dict, folder: Path) -> list[Path]:
    """The concurrency curve's charts (`bench --json`'s object); the acceptance chart only where the
    build reported acceptance by depth."""
    levels = report["levels"]
    fig, ax = _figure(f"Throughput against streams: {Path(report['target']).name}", "concurrent streams",
                      "aggregate tokens/s (median of rounds)")
    streams = [row["concurrency"] for row in levels]
    for key in ("target alone", "drafter"):
        ax.plot(streams, [row["aggregate_tokens_per_second"][key] for row in levels], marker="o", label=key)
    ax.set_xscale("log", base=2)
    ax.set_xticks(streams, [str(n) for n in streams])
    ax.legend()
    written = [folder / CURVE_CHARTS[0]]
    _save(fig, written[0])
    series = [(f"{row['concurrency']} stream(s)", row["drafting"].get("per_depth", [])) for row in levels]
    if any(depths for _, depths in series):
        fig, ax = _figure("Acceptance by depth", "draft depth", "share of steps accepting it")
        _depth_lines(ax, series)
        written.append(folder / CURVE_CHARTS[1])
        _save(fig, written[-1])
    return written


def suite_charts(report: dict, folder: Path) -> list[Path]:
    """`bench --suite`'s charts (its `--json` object)."""
    suites = report["suites"]
    fig, ax = _figure("Acceptance by depth, per suite", "draft depth", "share of steps accepting it")
    _depth_lines(ax, [(s["suite"], s["acceptance_by_depth"]) for s in suites])
    written = [folder / SUITE_CHARTS[0]]
    _save(fig, written[0])
    fig, ax = _figure("Accepted length per verify step", "tokens emitted by a verify step (accepted drafts + 1)",
                      "share of verify steps")
    longest = max((int(k) for s in suites for k in s["accepted_lengths"]), default=1)
    width = 0.8 / max(1, len(suites))
    for n, s in enumerate(suites):
        total = s["verify_steps"] or 1
        xs = range(1, longest + 1)
        ax.bar([x - 0.4 + width * (n + 0.5) for x in xs], [s["accepted_lengths"].get(str(x), 0) / total for x in xs],
               width=width, label=f"{s['suite']} (tau {s['tau']:.2f})")
    ax.set_xticks(list(range(1, longest + 1)))
    ax.legend(fontsize=8)
    written.append(folder / SUITE_CHARTS[1])
    _save(fig, written[-1])
    return written
