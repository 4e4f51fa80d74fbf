"""`make demo`: the main job end to end on the project's own tiny models.

Each step prints the command a user would type, runs it for real, and shows its output.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.fixtures.tiny_models import DRAFTERS, cached_fixtures
from tests.legacy_fixture import make_legacy
from tests.upstream import cached_target_gguf

OUT = Path("build/demo")


def step(title: str, *args, expect: int = 0) -> subprocess.CompletedProcess:
    print(f"\n== {title}\n$ dflash-gguf {' '.join(shlex.quote(str(a)) for a in args)}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "dflash_gguf.cli", *map(str, args)], text=True,
                          capture_output=True)
    sys.stdout.write(proc.stdout)
    sys.stdout.write(proc.stderr)
    if proc.returncode != expect:
        sys.exit(f"demo step failed (exit {proc.returncode}, expected {expect})")
    return proc


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    print("== fixtures: a tiny Qwen3 target (real Qwen2/Qwen3 BPE vocabulary) and z-lab-layout drafters")
    fixtures = cached_fixtures()
    target = cached_target_gguf("f16")
    print(f"   drafters: {', '.join(sorted(DRAFTERS))}\n   target:   {target}")

    for name in sorted(DRAFTERS):
        step(f"convert {name} against the target GGUF", "convert", fixtures / name, "--target", target,
             "-o", OUT / f"{name}.gguf", "--force")
    step("the same drafter against the target's HF folder", "convert", fixtures / "dflash2-b8",
         "--target", fixtures / "target-hf", "-o", OUT / "dflash2-b8-from-hf.gguf", "--outtype", "q8_0", "--force")
    step("inspect a DFlash 2 drafter", "inspect", OUT / "dflash2-b8.gguf")

    legacy = make_legacy(OUT / "dflash-b16.gguf", OUT / "legacy-dflash-draft.gguf")
    step("a legacy fork file is flagged ...", "inspect", legacy, expect=1)
    step("... and migrated to mainline without touching tensor bytes", "convert", legacy,
         "-o", OUT / "dflash-b16-migrated.gguf", "--force")

    with tempfile.TemporaryDirectory() as tmp:
        broken = Path(tmp) / "drafter"
        subprocess.run(["cp", "-r", str(fixtures / "dflash-b16"), str(broken)], check=True)
        config = broken / "config.json"
        config.write_text(config.read_text().replace('"target_layer_ids": [\n      0,\n      2,\n      4\n    ]',
                                                     '"target_layer_ids": [\n      0,\n      2,\n      9\n    ]'))
        step("a drafter made for a deeper target is refused: one line, exit 2, no file", "convert", broken,
             "--target", target, "-o", OUT / "refused.gguf", expect=2)

    print("\nOn your own model:\n  dflash-gguf convert path/to/Qwen3-8B-DFlash-b16 --target Qwen3-8B-Q4_K_M.gguf "
          "-o dflash-Qwen3-8B-F16.gguf --outtype f16\n  dflash-gguf inspect dflash-Qwen3-8B-F16.gguf")


if __name__ == "__main__":
    main()
