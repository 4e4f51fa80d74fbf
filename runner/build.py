"""Build the patched llama.cpp: pinned tree (or a checkout) + `ggml_patches/series` -> CMake -> cache.

Layout under `cache_dir()/llama/`:

    <key>/bin/            llama-server, llama-cli, llama-quantize, llama-speculative-simple,
                          llama-bench, ggml-rpc-server (llama.cpp's `rpc-server`, the RPC backend
                          is built in) and every shared library they load (rpath $ORIGIN, so the
                          folder is self-contained; `runtime_env()` adds the library path anyway)
    <key>/build.json      the manifest: key, backend, source, patches, cmake flags, date
    work/<source>-<backend>/src/     the patched sources, rewritten file by file only where the
                                     content changed, so make recompiles only what a patch touched
    work/<source>-<backend>/build/   the persistent CMake build folder, configured again in place
                                     when flags change (a dropped flag starts it anew)
    work/<source>-<backend>/build.log

`<key>` is the first 16 hex digits of sha256 over (source tree hash, patch series hash, backend,
the revision of the base CMake flags).
The source tree hash is cheap for the pinned tree (the sdist's pinned sha256). For `--source DIR`
it is, in a git checkout, `git rev-parse HEAD` plus the bytes of `git diff HEAD` plus the path and
content hash of every untracked, not ignored file; outside git it is the (path, size, mtime) list of
every file (no content read), so touching a file changes the key.

A finished build is published by renaming a complete temporary folder onto `<key>`; a key folder
that exists is always whole.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Iterator

from dflash_gguf import typed_reader as values
from dflash_gguf.errors import DflashError, LlamaBuildError
from dflash_gguf.progress import Progress, working
from dflash_gguf.hashing import sha256_file
from dflash_gguf.inputs import parse_json, read_bytes
from dflash_gguf.options import BACKENDS
from dflash_gguf.paths import cache_dir
from . import cuda_libs, sdist

log = logging.getLogger(__name__)

TARGETS = ("llama-server", "llama-cli", "llama-quantize", "llama-speculative-simple", "llama-bench",
           "ggml-rpc-server")
LIBRARY_TARGETS = ("llama", "ggml")  # built anyway as dependencies; named so a lib-only change relinks
KEY_LENGTH = 16

# folders of a user checkout that are never part of the source (build outputs, VCS data)
_SKIP_DIRS = {".git", ".github", "__pycache__", ".venv", "node_modules"}
_SKIP_DIR_PREFIXES = ("build",)


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# Backend selection and CMake flags: pure functions of (backend, platform), unit tested.
# ---------------------------------------------------------------------------------------------

def nvidia_gpu_present(driver_file: Path = Path("/proc/driver/nvidia/version")) -> bool:
    """An NVIDIA driver is loaded (a toolkit alone, as on CI machines, is not a GPU)."""
    return driver_file.exists()


def cuda_available(env: dict[str, str] | None = None, *, gpu: bool | None = None) -> bool:
    """A CUDA toolkit (`nvcc` on PATH or CUDA_HOME set) and an NVIDIA GPU to run what it builds."""
    env = os.environ if env is None else env
    if not (gpu if gpu is not None else nvidia_gpu_present()):
        return False
    if env.get("CUDA_HOME"):
        return True
    return shutil.which("nvcc", path=env.get("PATH", "")) is not None


def default_backend(platform: str = sys.platform, *, cuda: bool | None = None) -> str:
    """metal on macOS, cuda where a CUDA toolkit and an NVIDIA GPU are found, else cpu."""
    if platform == "darwin":
        return "metal"
    if cuda is None:
        cuda = cuda_available()
    return "cuda" if cuda else "cpu"


def rpath_origin(platform: str = sys.platform) -> str:
    return "@loader_path" if platform == "darwin" else "$ORIGIN"


def cuda_architectures(requested: str | None, *, gpu: bool | None = None) -> str:
    """The CMAKE_CUDA_ARCHITECTURES value of a CUDA build: what the user named, else `native`
    where a GPU is here to detect. Without either, ggml would compile every architecture it
    knows (hours), so the choice is the user's."""
    if requested:
        arches = requested.replace(",", ";").split(";")
        if not all(re.fullmatch(r"\d{2,3}[af]?(-real|-virtual)?|native|all|all-major", a) for a in arches):
            raise LlamaBuildError(f"--cuda-arch {requested!r}: expected compute capabilities such as "
                                  "90 (H100/H200), 89 (RTX 40xx), 86 (RTX 30xx), or 80;86")
        return ";".join(arches)
    if gpu if gpu is not None else nvidia_gpu_present():
        return "native"
    raise LlamaBuildError("no NVIDIA GPU here to detect the CUDA architecture from: name it with "
                          "--cuda-arch (e.g. 90 for H100/H200, 89 for RTX 40xx, 86 for RTX 30xx)")


def cmake_flags(backend: str, platform: str = sys.platform, *, curl_option: bool = False,
                cuda_arch: str | None = None) -> list[str]:
    """The CMake `-D` flags for a backend on a platform (`sys.platform` spelling).

    `curl_option`: the tree still has a live `LLAMA_CURL` option (newer trees only carry a
    deprecation stub for it, which warns when set). `cuda_arch`: CMAKE_CUDA_ARCHITECTURES of a
    CUDA build (see `cuda_architectures`).
    """
    if backend not in BACKENDS:
        raise LlamaBuildError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "metal" and platform != "darwin":
        raise LlamaBuildError(f"the metal backend needs macOS; this platform is {platform}")
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        # HTTPS for `llama-server -hf` (the Hub); without OpenSSL headers CMake only warns and the
        # download path speaks plain HTTP
        "-DLLAMA_OPENSSL=ON",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DBUILD_SHARED_LIBS=ON",
        # the RPC backend (`llama-server --rpc HOST:PORT,...`) and its `ggml-rpc-server`, so a
        # target can be split across machines
        "-DGGML_RPC=ON",
    ]
    if curl_option:
        flags.append("-DLLAMA_CURL=OFF")
    # binaries and libraries share one folder, in the build tree and once installed
    flags += ["-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", f"-DCMAKE_INSTALL_RPATH={rpath_origin(platform)}"]
    if backend == "cuda":
        flags.append("-DGGML_CUDA=ON")
        if cuda_arch:
            flags.append(f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}")
    elif backend == "metal":
        flags.append("-DGGML_METAL=ON")
    elif platform == "darwin":  # cpu on macOS: Metal is on by default there
        flags.append("-DGGML_METAL=OFF")
    return flags


def _flag_names(flags: list[str]) -> set[str]:
    return {f.split("=", 1)[0] for f in flags}


def reconfigurable(before: dict | None, wanted: dict) -> bool:
    """Whether a configured build folder can take the wanted flags by configuring it again in place
    (keeping what is compiled; CMake recompiles what the changed values touch): same source and
    generator, and no flag dropped, since a dropped `-D` would stay in CMake's cache."""
    return (before is not None and before.get("source") == wanted["source"]
            and before.get("generator") == wanted["generator"]
            and _flag_names(before.get("flags") or []) <= _flag_names(wanted["flags"]))


def tree_has_curl_option(tree: Path) -> bool:
    """Whether the tree's top CMakeLists declares a real `option(LLAMA_CURL ...)`."""
    try:
        text = (tree / "CMakeLists.txt").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r"^\s*option\s*\(\s*LLAMA_CURL\b", text, re.MULTILINE) is not None


def runtime_env(bin_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which the binaries of `bin_dir` find its shared libraries."""
    env = dict(os.environ if base is None else base)
    var = "DYLD_LIBRARY_PATH" if sys.platform == "darwin" else "LD_LIBRARY_PATH"
    if sys.platform == "win32":
        var = "PATH"
    parts = [str(bin_dir)] + [p for p in env.get(var, "").split(os.pathsep) if p]
    env[var] = os.pathsep.join(parts)
    return env


# ---------------------------------------------------------------------------------------------
# Patches
# ---------------------------------------------------------------------------------------------

def patches_dir() -> Path:
    """The shipped patch series: package data `dflash_gguf.ggml_patches` (`ggml_patches/` in a checkout)."""
    return Path(str(files("dflash_gguf.ggml_patches")))


def read_series(folder: Path | None = None) -> list[Path]:
    """The patch files named in `series`, in order (blank lines and `#` comments skipped)."""
    folder = patches_dir() if folder is None else folder
    series = folder / "series"
    if not series.is_file():
        raise LlamaBuildError(f"{series}: missing; it lists the patches to apply, one per line")
    patches = []
    for lineno, line in enumerate(series.read_text(encoding="utf-8").splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        path = folder / name
        if not path.is_file():
            raise LlamaBuildError(f"{series}:{lineno}: patch {name} does not exist in {folder}")
        patches.append(path)
    return patches


def patches_hash(patches: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in patches:
        digest.update(path.name.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def patched_paths(patch: Path) -> list[str]:
    """Paths (relative to the tree root, -p1) that a unified diff writes."""
    paths = []
    for line in patch.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("+++ "):
            name = line[4:].split("\t", 1)[0].strip()
            if name == "/dev/null":
                continue
            parts = name.split("/", 1)
            if len(parts) == 2:
                paths.append(parts[1])
    return paths


def _apply_patch(patch: Path, root: Path) -> None:
    """Apply one -p1 patch inside `root`; LlamaBuildError names the patch when it does not apply."""
    if shutil.which("patch"):
        cmd = ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-s", "-i", str(patch)]
    elif shutil.which("git"):
        cmd = ["git", "apply", "-p1", "--whitespace=nowarn", str(patch)]
    else:
        raise LlamaBuildError("neither `patch` nor `git` is installed; one of them applies ggml_patches/")
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = (proc.stdout + proc.stderr).strip().splitlines()
        failed = [line for line in detail if "FAILED" in line or "error" in line.lower()
                  or "Reversed" in line or "can't find" in line.lower()]
        first = (failed or detail or ["no output"])[0].strip()
        raise LlamaBuildError(
            f"patch {patch.name} no longer applies to this llama.cpp tree ({first}); "
            f"refresh it against the tree or drop it from {patch.parent / 'series'}")


# ---------------------------------------------------------------------------------------------
# Source trees
# ---------------------------------------------------------------------------------------------

@dataclass
class Source:
    """A llama.cpp tree to build: the pinned sdist tree or a user checkout."""

    tree: Path
    ident: str          # what build.json records: "llama-cpp-python==0.3.36 sdist" or the path
    work_name: str      # names the persistent work folder (stable per location, not per content)
    tree_hash: str      # changes whenever the tree's content (or, outside git, an mtime) does


def _git(tree: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True)


def source_tree_hash(tree: Path) -> str:
    """See the module docstring: git HEAD + diff + untracked files, else a (path, size, mtime) list."""
    digest = hashlib.sha256()
    head = _git(tree, "rev-parse", "HEAD") if shutil.which("git") else None
    top = _git(tree, "rev-parse", "--show-toplevel") if head is not None else None
    if head is not None and head.returncode == 0 and top is not None and \
            Path(top.stdout.decode().strip()).resolve() == tree.resolve():
        digest.update(b"git\0" + head.stdout.strip() + b"\0")
        diff = _git(tree, "diff", "HEAD", "--binary")
        digest.update(hashlib.sha256(diff.stdout).digest())
        untracked = _git(tree, "ls-files", "--others", "--exclude-standard", "-z")
        for name in sorted(n for n in untracked.stdout.split(b"\0") if n):
            path = tree / name.decode(errors="surrogateescape")
            digest.update(name + b"\0")
            if path.is_file():
                digest.update(bytes.fromhex(sha256_file(path)))
        return digest.hexdigest()
    digest.update(b"files\0")
    for rel, path in _walk_files(tree):
        st = path.stat()
        digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0".encode(errors="surrogateescape"))
    return digest.hexdigest()


def pinned_source() -> Source:
    tree = sdist.pinned_tree()
    return Source(tree=tree, ident=f"{sdist.PACKAGE}=={sdist.VERSION} sdist (sha256 {sdist.SDIST_SHA256})",
                  work_name=f"pinned-{sdist.VERSION}", tree_hash=f"sdist:{sdist.SDIST_SHA256}")


def user_source(path: Path) -> Source:
    tree = Path(path).expanduser().resolve()
    if not (tree / "CMakeLists.txt").is_file() or not (tree / "src").is_dir():
        raise LlamaBuildError(f"{tree}: not a llama.cpp checkout (no CMakeLists.txt and src/ at its root)")
    place = hashlib.sha256(str(tree).encode()).hexdigest()[:12]
    return Source(tree=tree, ident=str(tree), work_name=f"src-{place}", tree_hash=source_tree_hash(tree))


# The revision of what `cmake_flags` gives every build; part of the key, so a change of the flags
# (2: LLAMA_OPENSSL on; 3: GGML_RPC on) is a new build rather than an old one under the same key.
FLAGS_REVISION = 3


def build_key(source_hash: str, series_hash: str, backend: str) -> str:
    blob = json.dumps({"source": source_hash, "patches": series_hash, "backend": backend,
                       "flags": FLAGS_REVISION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:KEY_LENGTH]


def llama_root() -> Path:
    return cache_dir() / "llama"


def build_dir_for(key: str) -> Path:
    return llama_root() / key


def _walk_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative posix path, path) of every file under root, build outputs and VCS data skipped."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(_SKIP_DIR_PREFIXES)]
        else:
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        dirnames.sort()
        for name in sorted(filenames):
            if name == ".git":  # a submodule's gitlink file (the sdist tree carries one)
                continue
            path = here / name
            if path.is_symlink() and not path.exists():
                continue
            yield path.relative_to(root).as_posix(), path


def _same_content(a: Path, b: Path) -> bool:
    try:
        if a.stat().st_size != b.stat().st_size:
            return False
    except FileNotFoundError:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            ca, cb = fa.read(1 << 20), fb.read(1 << 20)
            if ca != cb:
                return False
            if not ca:
                return True


def sync_tree(files: dict[str, Path], dest: Path) -> tuple[int, int]:
    """Make `dest` hold exactly `files` (relative path -> source file).

    Only files whose content differs are rewritten (with a fresh mtime, so make rebuilds their
    dependants); unchanged files keep their mtime. Files under dest that are not in `files` are
    removed. Returns (written, removed).
    """
    dest.mkdir(parents=True, exist_ok=True)
    written = removed = 0
    for rel, src in files.items():
        target = dest / rel
        if target.is_file() and not target.is_symlink() and _same_content(src, target):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        shutil.copyfile(src, target)
        shutil.copymode(src, target)
        written += 1
    for rel, path in list(_walk_files(dest)):
        if rel not in files:
            path.unlink()
            removed += 1
    return written, removed


def patched_file_map(tree: Path, patches: list[Path], staging: Path) -> dict[str, Path]:
    """Apply `patches` to copies of the files they touch (in `staging`); return the full file map
    of the patched tree: every file of `tree`, the patched ones pointing into `staging`."""
    files = dict(_walk_files(tree))
    touched = sorted({p for patch in patches for p in patched_paths(patch)})
    for rel in touched:
        if rel in files:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(files[rel], staging / rel)
    for patch in patches:
        _apply_patch(patch, staging)
    for rel, path in _walk_files(staging):
        files[rel] = path
    return files


# ---------------------------------------------------------------------------------------------
# The build
# ---------------------------------------------------------------------------------------------

@dataclass
class BuildResult:
    key: str
    root: Path                      # cache_dir()/llama/<key>
    manifest: dict = field(default_factory=dict)
    built: bool = True              # False: the key was already in the cache

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"


def plan(backend: str | None = None, source_dir: Path | None = None) -> tuple[Source, list[Path], str, str]:
    """(source, patches, backend, key) for a build request, without building anything."""
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise LlamaBuildError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    source = user_source(source_dir) if source_dir is not None else pinned_source()
    patches = read_series()
    key = build_key(source.tree_hash, patches_hash(patches), backend)
    return source, patches, backend, key


def key_for(backend: str | None = None, source_dir: Path | None = None) -> str:
    """The key a build would have, computed without touching the network for the pinned tree."""
    backend = backend or default_backend()
    if source_dir is not None:
        tree_hash = user_source(source_dir).tree_hash
    else:
        tree_hash = f"sdist:{sdist.SDIST_SHA256}"
    return build_key(tree_hash, patches_hash(read_series()), backend)


def find_build(backend: str | None = None, source_dir: Path | None = None) -> Path | None:
    """The bin folder of the finished build for the current key, or None."""
    root = build_dir_for(key_for(backend, source_dir))
    if (root / "build.json").is_file() and (root / "bin").is_dir():
        return root / "bin"
    return None


def find_bin_dir(backend: str | None = None, llama_bin: str | Path | None = None) -> Path:
    """The bin folder of the llama.cpp build a command runs: `llama_bin` when given (any build,
    e.g. `--llama-bin DIR`), else the patched build for `backend`; without a backend, the default
    backend's build, else the CPU build when that is the one that exists."""
    if llama_bin is not None:
        if not Path(llama_bin).is_dir():
            raise LlamaBuildError(f"{llama_bin}: not a folder; --llama-bin is the bin folder of a llama.cpp build")
        return Path(llama_bin)
    found = find_build(backend)
    if found is None and backend is None and default_backend() != "cpu":
        found = find_build("cpu")
        if found is not None:
            log.info("no %s build of the patched llama.cpp; using the cpu build %s", default_backend(), found)
    if found is None:
        raise LlamaBuildError(
            f"no patched llama.cpp build for backend {backend or default_backend()}; "
            f"build it with `dflash-gguf llama build{' --backend ' + backend if backend else ''}`")
    return Path(found)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            # extra: POSIX only
            import fcntl
        except ImportError:  # Windows: no advisory lock, builds of one work folder must not overlap
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_logged(cmd: list[str], log: Path, progress: Progress, label: str, cwd: Path | None = None) -> None:
    """Run a build step, its output appended to `log`; report its percentage as it moves."""
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        try:
            last = -10
            assert proc.stdout is not None
            # one big file compiles for minutes on 2 cores between two percentages: the heartbeat speaks
            with working(progress, label) as step:
                for line in proc.stdout:
                    out.write(line)
                    match = re.match(r"\[\s*(\d+)%\]", line) or re.match(r"\[(\d+)/(\d+)\]", line)
                    if match:
                        pct = int(match.group(1)) if match.lastindex == 1 else \
                            100 * int(match.group(1)) // max(1, int(match.group(2)))
                        if pct >= last + 10:
                            last = pct - pct % 10
                            step.say(f"{label}: {pct}%")
                rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if rc != 0:
        tail = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
        errors = [line for line in tail if "error" in line.lower()]
        hint = (errors or tail or ["no output"])[-1].strip()
        raise LlamaBuildError(f"{label} failed (exit {rc}): {hint[:300]} (full log: {log})")


def _install(build: Path, dest_bin: Path) -> list[str]:
    """Copy the target executables and every shared library of the build's bin folder."""
    out_bin = build / "bin"
    dest_bin.mkdir(parents=True)
    installed = []
    exe = ".exe" if sys.platform == "win32" else ""
    for name in TARGETS:
        src = out_bin / f"{name}{exe}"
        if not src.is_file():
            raise LlamaBuildError(f"the build did not produce {src}")
        shutil.copy2(src, dest_bin / src.name)
        installed.append(src.name)
    lib_dirs = [out_bin] + [p for p in (build / "src", build / "ggml" / "src", build / "common") if p.is_dir()]
    seen = set(installed)
    for folder in lib_dirs:
        for path in sorted(folder.iterdir()):
            if path.name in seen or not re.search(r"\.(so(\.\d+)*|dylib|dll)$", path.name):
                continue
            if path.is_symlink():
                os.symlink(os.readlink(path), dest_bin / path.name)
            else:
                shutil.copy2(path, dest_bin / path.name)
            seen.add(path.name)
            installed.append(path.name)
    return installed


def _work_dir(source: Source, backend: str) -> Path:
    return llama_root() / "work" / f"{source.work_name}-{backend}"


def _patch_into(source: Source, patches: list[Path], work: Path, progress: Progress) -> Path:
    progress(f"patching {source.ident} with {len(patches)} patch(es)")
    with tempfile.TemporaryDirectory(dir=work, prefix=".stage-") as staging:
        files = patched_file_map(source.tree, patches, Path(staging))
        written, removed = sync_tree(files, work / "src")
    progress(f"source folder {work / 'src'}: {written} file(s) rewritten, {removed} removed")
    return work / "src"


def prepare(backend: str | None = None, source_dir: Path | None = None,
            progress: Progress | None = None) -> Path:
    """Fetch and patch the tree without compiling; return the patched source folder."""
    progress = progress or _quiet
    source, patches, backend, _ = plan(backend, source_dir)
    work = _work_dir(source, backend)
    with _locked(work / ".lock"):
        return _patch_into(source, patches, work, progress)


def build(backend: str | None = None, source_dir: Path | None = None, jobs: int | None = None,
          progress: Progress | None = None, force: bool = False,
          cuda_arch: str | None = None) -> BuildResult:
    """Patch, configure, build and publish llama.cpp; return where it landed.

    A key already in the cache is returned as is (`built=False`) unless `force`, or, for a CUDA
    build, unless `cuda_arch` names other architectures than the cached build's (the key holds
    one CUDA build per source and patches; it is rebuilt for the architectures asked for).
    """
    progress = progress or _quiet
    source, patches, backend, key = plan(backend, source_dir)
    root = build_dir_for(key)
    platform = sys.platform
    if not force and (root / "build.json").is_file():
        manifest = read_manifest(root / "build.json")
        other_arch = backend == "cuda" and cuda_arch and \
            f"-DCMAKE_CUDA_ARCHITECTURES={cuda_architectures(cuda_arch)}" not in manifest.get("cmake_flags", [])
        if not other_arch:
            return BuildResult(key=key, root=root, manifest=manifest, built=False)
    if shutil.which("cmake") is None:
        raise LlamaBuildError("cmake is not installed; install it (e.g. `apt-get install cmake`, `brew install cmake`)")

    flags = cmake_flags(backend, platform, curl_option=tree_has_curl_option(source.tree),
                        cuda_arch=cuda_architectures(cuda_arch) if backend == "cuda" else None)
    if backend == "cuda":
        flags += cuda_libs.cmake_flags(cuda_libs.find_toolkit())
    work = _work_dir(source, backend)
    jobs = jobs or os.cpu_count() or 2

    with _locked(work / ".lock"):
        log = work / "build.log"
        log.write_text(f"dflash-gguf llama build {key} ({backend}) {_dt.datetime.now().isoformat()}\n",
                       encoding="utf-8")
        _patch_into(source, patches, work, progress)

        build_dir = work / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        stamp = build_dir / ".dflash-configure.json"
        wanted = {"flags": flags, "generator": generator, "source": str(work / "src")}
        before = _configured(stamp)
        configured = before == wanted and (build_dir / "CMakeCache.txt").is_file()
        if not configured:
            if build_dir.exists() and not reconfigurable(before, wanted):
                shutil.rmtree(build_dir)
            build_dir.mkdir(parents=True, exist_ok=True)
            progress(f"configuring ({backend}): cmake {' '.join(flags)}")
            _run_logged(["cmake", "-S", str(work / "src"), "-B", str(build_dir), *generator, *flags],
                        log, progress, "cmake configure")
            stamp.write_text(json.dumps(wanted), encoding="utf-8")

        progress(f"building {' '.join(TARGETS)} with {jobs} job(s) (log: {log})")
        _run_logged(["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs),
                     "--target", *TARGETS, *LIBRARY_TARGETS], log, progress, "cmake build")

        llama_root().mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=llama_root(), prefix=f".tmp-{key}-"))
        tmp.chmod(0o755)  # mkdtemp makes it private; the build is for every user of this cache
        try:
            installed = _install(build_dir, tmp / "bin")
            manifest = {
                "key": key,
                "backend": backend,
                "platform": platform,
                "source": source.ident,
                "source_hash": source.tree_hash,
                "patches": [{"name": p.name, "sha256": sha256_file(p)} for p in patches],
                "patches_hash": patches_hash(patches),
                "cmake_flags": flags,
                "targets": list(TARGETS),
                "files": installed,
                "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            }
            (tmp / "build.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            if root.exists():  # --force, or a concurrent build of the same key finished first
                old = Path(tempfile.mkdtemp(dir=llama_root(), prefix=f".old-{key}-"))
                os.rename(root, old / "x")
                os.rename(tmp, root)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    progress(f"installed {root / 'bin'}")
    return BuildResult(key=key, root=root, manifest=manifest, built=True)


# patch 0007's switch for ggml-cpu's reference kernels (`--exact`); its name is in the CPU library
REFERENCE_KERNELS_ENV = "GGML_CPU_USE_REF"


def has_reference_kernels(bin_dir: Path) -> bool:
    """Whether the CPU backend of the build in `bin_dir` reads REFERENCE_KERNELS_ENV (a build with
    patch 0007; a stock llama.cpp build does not)."""
    mark = REFERENCE_KERNELS_ENV.encode()
    libraries = {p.resolve() for p in Path(bin_dir).glob("*ggml-cpu*") if p.is_file()}
    return any(mark in p.read_bytes() for p in libraries)


MANIFEST_LIMIT = 1 << 20  # bytes: a manifest lists some dozen files and flags


def _configured(stamp: Path) -> dict | None:
    """What the build folder was last configured with (its stamp), None when unknown: a stamp that cannot
    be read as one (not a regular file, too large, not JSON of that shape) only means configuring anew."""
    if not os.path.lexists(stamp):
        return None
    try:
        before = values.mapping(stamp, "stamp", parse_json(read_bytes(stamp, "configure stamp", MANIFEST_LIMIT), stamp))
        values.string_list(stamp, "flags", before.get("flags"))
        values.string_list(stamp, "generator", before.get("generator"))
    except DflashError:
        return None
    return before


def read_manifest(path: Path) -> dict:
    """A build's build.json, read as untrusted input (another user's cache, or a tampered one): a regular
    file only (a FIFO is refused, not waited on), bounded in size and depth, and the values the
    tools use typed; LlamaBuildError naming the file and the field otherwise."""
    fix = f"; remove {path.parent} or rebuild it with `dflash-gguf llama build --rebuild`"
    try:
        manifest = values.mapping(path, "manifest", parse_json(read_bytes(path, "build record", MANIFEST_LIMIT), path),
                                  LlamaBuildError)
        for name in ("key", "backend"):
            if manifest.get(name) is not None and not _MANIFEST_WORD.fullmatch(
                    values.string(path, name, manifest[name], 128, error=LlamaBuildError)):
                raise LlamaBuildError(f"{path}: field {name!r} is not a build {name}")
        values.string_list(path, "cmake_flags", manifest.get("cmake_flags"), LlamaBuildError)
    except DflashError as err:
        raise LlamaBuildError(f"{err}{fix}") from None
    return manifest


_MANIFEST_WORD = re.compile(r"[A-Za-z0-9._-]+", re.ASCII)


def build_info(bin_dir: Path, backend: str | None) -> dict:
    """Which patched build ran: backend, build key, bin folder."""
    manifest = bin_dir.parent / "build.json"
    build = read_manifest(manifest) if os.path.lexists(manifest) else {}
    return {"backend": build.get("backend", backend), "build": build.get("key", bin_dir.parent.name),
            "bin": str(bin_dir)}
