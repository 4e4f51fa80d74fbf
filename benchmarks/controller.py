"""The draft-length controller against the target alone and the static lengths, side by side.

For each target type, drafter and prompt set, one server per setting (the target alone, static
`--spec-draft-n-max` 1, 3 and the drafter's whole length, and `auto`), all up together; each round
sends every prompt to each server in turn, the order rotating by round (benchmarks/side_by_side.py).
Reported per set: tokens/s of each, the best static setting, auto and the best static over the
target alone (judged by runner/speed.py: withheld above tau or when the rounds spread wider than the
effect), auto over the best static, auto's parked share and draft lengths (from the responses' timings), and whether
every setting's tokens equal the target alone's.

Prompt sets and pairs: benchmarks/prompt_sets.py (`chat`, `code`, `mixed`, `writingbench`, ...).

    python -m benchmarks.controller [--pair smollm2|trained|memory-bound] [--types F16] [--drafters dflash2] [--sets chat,code,mixed]
                                    [--rounds 3] [--n-predict 64] [--prompts 4]
                                    [--static 1,3,block|none] [--fresh] [--alone-again] [--p-min P]

`--alone-again` adds a second target-alone server to the same rounds: its ratio to the first (median and
95 % interval) is what two servers with no difference measure here, beside auto's. `--p-min P` gives the
static lengths `--spec-draft-p-min P` and adds `auto` with it beside `auto` without
(docs/speed.md#the-controller-and-p_min).

JSON on stdout, progress on stderr; docs/speed.md#the-draft-length-controller shows the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from dflash_gguf.options import AUTO
from dflash_gguf.runner.build import find_bin_dir
from dflash_gguf.runner.launch import launch_recipe, read_draft
from dflash_gguf.runner.measure import mean_acceptance_length
from dflash_gguf.runner.prompts import tokenize_prompts
from dflash_gguf.runner.speed import RoundServers, judge, median_interval, shown
from dflash_gguf.validation.acceptance import limit_fields, timings_profile
from benchmarks.side_by_side import measure_side_by_side, progress
from benchmarks.prompt_sets import pair_files, prompt_set

ALONE = "alone"
ALONE_AGAIN = "alone (again)"
P_MIN = "--spec-draft-p-min"


def settings(draft: Path, statics: str = "1,3,block", p_min: float | None = None) -> dict[str, tuple[int | str, list[str]]]:
    """Each drafting server's --spec-draft-n-max and added flags by name; `statics`: the static lengths
    measured beside auto ("block": the drafter's whole draft; "none": auto alone); `p_min`: the static
    lengths at that --spec-draft-p-min, and auto with it beside auto without."""
    longest = read_draft(draft).draft_length
    wanted = {longest if x == "block" else int(x) for x in statics.split(",") if x != "none"}
    lengths = sorted(wanted & set(range(1, longest + 1)))
    cut = [P_MIN, f"{p_min:g}"] if p_min is not None else []
    label = f" p_min {p_min:g}" if p_min is not None else ""
    return {**{f"n {n}{label}": (n, cut) for n in lengths}, AUTO: (AUTO, []),
            **({auto_p_min(p_min): (AUTO, cut)} if p_min is not None else {})}


def auto_p_min(p_min: float) -> str:
    return f"{AUTO} p_min {p_min:g}"


def measure(target: Path, draft: Path, texts: list, rounds: int, n_predict: int, bin_dir: Path,
            statics: str = "1,3,block", other_builds: dict[str, Path] | None = None, fresh: bool = False,
            alone_again: bool = False, p_min: float | None = None) -> dict:
    """`other_builds`: label -> another build's bin folder whose auto (and auto at `p_min`) runs beside
    this build's (as "auto (label)", "auto p_min P (label)"), to measure a change of the controller side by side; `fresh`: new servers for
    each round (runner/speed.py RoundServers); `alone_again`: a second target-alone server in the same
    rounds (an A/A pair: its ratio to the first is the spread of two servers with no difference);
    `p_min`: settings()'s."""
    launches = {ALONE: launch_recipe(target, None, server_args=["-c", "4096"])}
    if alone_again:
        launches[ALONE_AGAIN] = launches[ALONE]
    for name, (n_max, flags) in settings(draft, statics, p_min).items():
        launches[name] = launch_recipe(target, draft, draft_max=n_max, server_args=["-c", "4096", *flags], check=False)
    bins = {name: bin_dir for name in launches}
    autos = [AUTO] + ([auto_p_min(p_min)] if p_min is not None else [])
    for label, other in (other_builds or {}).items():
        for name in autos:
            launches[f"{name} ({label})"], bins[f"{name} ({label})"] = launches[name], other
    with launches[ALONE].server(bin_dir=bin_dir) as server:
        ids = tokenize_prompts(server.client, texts)
    makers = {name: (lambda launch=launch, b=bins[name]: launch.server(bin_dir=b)) for name, launch in launches.items()}
    # not measured: a whole request, so that a new server has calibrated auto and learned some acceptance
    warm_up = lambda server: server.client.complete(ids[0], n_predict, cache_prompt=False)  # noqa: E731
    with RoundServers(makers, fresh, warm_up) as servers:
        out = measure_side_by_side(servers, ids, n_predict, rounds)
    ms, answers, names = out.ms, out.answers, list(out.ms)
    speed = {n: round(1000.0 / statistics.median(v), 2) for n, v in ms.items()}
    per_round = {n: [1000.0 / x for x in v] for n, v in ms.items()}
    ratio = lambda a, b: [x / y for x, y in zip(per_round[a], per_round[b])]  # noqa: E731
    best = max((n for n in speed if n.startswith("n ")), key=speed.get, default=None)

    def judged(name: str, against: str) -> dict:
        """`name` over `against`, per round, as runner/speed.py judges a speedup (bounded by name's tau)."""
        produced = sum(c.n_predicted for c in answers[name])
        accepted = sum(c.draft_n_accepted for c in answers[name])
        drafted = sum(c.draft_n for c in answers[name])
        tau = mean_acceptance_length(produced, accepted, len(answers[name])) if drafted else 1.0
        return judge(ratio(name, against), tau).to_dict()

    def median_below_tau(name: str) -> float | None:
        """The rounds' median over the target alone whatever the judgement (which says whether it
        stands), never a figure above tau."""
        median, bound = statistics.median(ratio(name, ALONE)), judged(name, ALONE)["tau_bound"]
        return round(median, 3) if bound is None or median <= bound else None

    def spread(name: str) -> dict:
        """An A/A ratio: no tau bounds it, its median and interval are the measurement's own noise."""
        rs = ratio(name, ALONE)
        low, high = median_interval(rs)
        return {"median": round(statistics.median(rs), 3), "interval": [round(low, 3), round(high, 3)],
                "range": [round(min(rs), 3), round(max(rs), 3)]}

    auto = judged(AUTO, ALONE)
    confident = auto_p_min(p_min) if p_min is not None else None
    return {"tokens_per_second": speed, "best_static": best,
            **({"auto_p_min": {"p_min": p_min, "over_alone": judged(confident, ALONE),
                               "over_auto": round(statistics.median(ratio(confident, AUTO)), 3),
                               "over_auto_interval": [round(x, 3) for x in median_interval(ratio(confident, AUTO))],
                               "over_best_static": round(statistics.median(ratio(confident, best)), 3) if best else None,
                               "drafting": timings_profile(c.timings for c in answers[confident])}}
               if confident else {}),
            **({"alone_again_over_alone": spread(ALONE_AGAIN)} if alone_again else {}),
            "auto_over_alone": auto,
            "auto_over_alone_median": median_below_tau(AUTO),
            "other_builds": {n: {"over_alone": judged(n, ALONE), "over_alone_median": median_below_tau(n),
                                 "this_build_over_it": round(statistics.median(ratio(n.rsplit(" (", 1)[0], n)), 3)}
                             for n in names if n.startswith(AUTO) and n.endswith(")")},
            "best_static_over_alone": judged(best, ALONE) if best else None,
            "auto_over_best_static": round(statistics.median(ratio(AUTO, best)), 3) if best else None,
            "auto_drafting": timings_profile(c.timings for c in answers[AUTO]),
            "auto_limit": limit_fields((c.timings for c in answers[AUTO]), auto["speedup"]),
            "identical": {n: [c.tokens for c in answers[n]] == [c.tokens for c in answers[ALONE]]
                          for n in names if n not in (ALONE, ALONE_AGAIN)},
            "rounds": rounds, "fresh": fresh, "prompts": len(ids), "n_predict": n_predict}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("smollm2", "trained", "memory-bound"), default="smollm2")
    parser.add_argument("--types", default="F16")
    parser.add_argument("--drafters", default="dflash2")
    parser.add_argument("--sets", default="chat,code,mixed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--static", default="1,3,block", help="static lengths beside auto: e.g. 1,3,block, or none")
    parser.add_argument("--fresh", action="store_true", help="new servers for every round (runner/speed.py RoundServers)")
    parser.add_argument("--other-build", action="append", default=[], metavar="LABEL=BIN_DIR",
                        help="another build's auto beside this build's, e.g. before=~/.cache/dflash-gguf/llama/<key>/bin")
    parser.add_argument("--p-min", type=float, default=None,
                        help="--spec-draft-p-min for the static lengths, and auto with it beside auto without")
    parser.add_argument("--alone-again", action="store_true",
                        help="a second target-alone server in the same rounds: what two servers with no difference "
                             "measure (an A/A pair), beside auto's ratio")
    args = parser.parse_args(argv)
    files = pair_files(args.pair)
    bin_dir = find_bin_dir(None, None)
    others = {k: Path(v).expanduser() for k, v in (o.split("=", 1) for o in args.other_build)}
    rows = []
    for qtype in args.types.split(","):
        for drafter in args.drafters.split(","):
            for name in args.sets.split(","):
                progress(f"{qtype} {drafter} {name}")
                row = measure(files[qtype], files[drafter], prompt_set(name, args.prompts), args.rounds,
                              args.n_predict, bin_dir, args.static, others, args.fresh, args.alone_again, args.p_min)
                rows.append({"pair": args.pair, "type": qtype, "drafter": drafter, "set": name, **row})
                beside = f"; {row['auto_over_best_static']}x the best static ({row['best_static']})" if row["best_static"] else ""
                progress(f"{qtype} {drafter} {name}: auto against the target alone {shown(row['auto_over_alone'])}{beside}")
                if "auto_p_min" in row:
                    ap = row["auto_p_min"]
                    progress(f"{qtype} {drafter} {name}: auto p_min {ap['p_min']:g} against the target alone "
                             f"{shown(ap['over_alone'])}; {ap['over_auto']}x auto (95 % interval "
                             f"{ap['over_auto_interval'][0]}-{ap['over_auto_interval'][1]})")
                for other, o in row["other_builds"].items():
                    progress(f"{qtype} {drafter} {name}: {other} against the target alone {shown(o['over_alone'])}; "
                             f"this build's over it {o['this_build_over_it']}x")
                if args.alone_again:
                    aa = row["alone_again_over_alone"]
                    progress(f"{qtype} {drafter} {name}: a second target alone against the first {aa['median']}x "
                             f"(95 % interval {aa['interval'][0]}-{aa['interval'][1]})")
    json.dump({"rows": rows}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
