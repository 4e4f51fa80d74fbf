"""The llama.cpp build's pure parts: backend choice, CMake flags, keys, patch series. No compiling."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from dflash_gguf.errors import LlamaBuildError
from dflash_gguf.runner import build

BASE = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_OPENSSL=ON", "-DLLAMA_BUILD_TESTS=OFF",
        "-DBUILD_SHARED_LIBS=ON"]


# --- backend choice ------------------------------------------------------------------------

def test_default_backend_is_metal_on_macos_whatever_cuda_says():
    assert build.default_backend("darwin", cuda=True) == "metal"
    assert build.default_backend("darwin", cuda=False) == "metal"


@pytest.mark.parametrize("platform", ["linux", "win32"])
def test_default_backend_follows_cuda_elsewhere(platform):
    assert build.default_backend(platform, cuda=True) == "cuda"
    assert build.default_backend(platform, cuda=False) == "cpu"


def _fake_nvcc(folder: Path) -> None:
    nvcc = folder / "nvcc"
    nvcc.write_text("#!/bin/sh\nexit 0\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)


def test_cuda_available_from_nvcc_on_path(tmp_path):
    assert not build.cuda_available({"PATH": str(tmp_path)}, gpu=True)
    _fake_nvcc(tmp_path)
    assert build.cuda_available({"PATH": str(tmp_path)}, gpu=True)


def test_cuda_available_from_cuda_home(tmp_path):
    assert build.cuda_available({"PATH": str(tmp_path), "CUDA_HOME": "/opt/cuda"}, gpu=True)
    assert not build.cuda_available({"PATH": str(tmp_path), "CUDA_HOME": ""}, gpu=True)


def test_a_toolkit_without_a_gpu_is_not_cuda(tmp_path):
    _fake_nvcc(tmp_path)
    assert not build.cuda_available({"PATH": str(tmp_path), "CUDA_HOME": "/opt/cuda"}, gpu=False)


def test_gpu_presence_is_the_nvidia_driver(tmp_path):
    driver = tmp_path / "version"
    assert not build.nvidia_gpu_present(driver)
    driver.write_text("NVRM version: 580\n")
    assert build.nvidia_gpu_present(driver)


# --- CMake flags ---------------------------------------------------------------------------

def test_cpu_flags_on_linux_are_the_base_set_plus_rpath():
    flags = build.cmake_flags("cpu", "linux")
    assert flags[:4] == BASE
    assert "-DCMAKE_INSTALL_RPATH=$ORIGIN" in flags
    assert "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON" in flags
    assert not any(f.startswith(("-DGGML_CUDA", "-DGGML_METAL", "-DLLAMA_CURL")) for f in flags)


def test_cpu_on_macos_turns_metal_off():
    flags = build.cmake_flags("cpu", "darwin")
    assert "-DGGML_METAL=OFF" in flags
    assert "-DCMAKE_INSTALL_RPATH=@loader_path" in flags


def test_cuda_flags():
    flags = build.cmake_flags("cuda", "linux")
    assert "-DGGML_CUDA=ON" in flags and flags[:4] == BASE


def test_metal_flags_on_macos():
    flags = build.cmake_flags("metal", "darwin")
    assert "-DGGML_METAL=ON" in flags and "-DGGML_METAL=OFF" not in flags


def test_metal_elsewhere_is_refused():
    with pytest.raises(LlamaBuildError, match="macOS"):
        build.cmake_flags("metal", "linux")


def test_unknown_backend_is_refused():
    with pytest.raises(LlamaBuildError, match="unknown backend 'vulkan'"):
        build.cmake_flags("vulkan", "linux")


def test_curl_flag_only_when_the_tree_has_the_option(tmp_path):
    assert "-DLLAMA_CURL=OFF" in build.cmake_flags("cpu", "linux", curl_option=True)
    (tmp_path / "CMakeLists.txt").write_text('llama_option_depr(WARNING     LLAMA_CURL)\n')
    assert not build.tree_has_curl_option(tmp_path)
    (tmp_path / "CMakeLists.txt").write_text('option(LLAMA_CURL "llama: use libcurl" ON)\n')
    assert build.tree_has_curl_option(tmp_path)


def test_runtime_env_puts_the_bin_folder_first(tmp_path):
    env = build.runtime_env(tmp_path, {"LD_LIBRARY_PATH": "/x", "DYLD_LIBRARY_PATH": "/x", "PATH": "/x"})
    var = {"darwin": "DYLD_LIBRARY_PATH", "win32": "PATH"}.get(os.sys.platform, "LD_LIBRARY_PATH")
    assert env[var].split(os.pathsep) == [str(tmp_path), "/x"]


# --- keys ----------------------------------------------------------------------------------

def test_key_changes_with_each_input():
    key = build.build_key("src", "patches", "cpu")
    assert len(key) == build.KEY_LENGTH and int(key, 16) >= 0
    assert key == build.build_key("src", "patches", "cpu")
    others = {build.build_key("src2", "patches", "cpu"), build.build_key("src", "patches2", "cpu"),
              build.build_key("src", "patches", "cuda")}
    assert key not in others and len(others) == 3


def test_patch_hash_follows_content_and_order(tmp_path):
    a, b = tmp_path / "0001-a.patch", tmp_path / "0002-b.patch"
    a.write_text("one\n")
    b.write_text("two\n")
    first = build.patches_hash([a, b])
    assert build.patches_hash([b, a]) != first
    b.write_text("two, refreshed\n")
    assert build.patches_hash([a, b]) != first


def test_source_hash_of_a_git_checkout_sees_edits_and_untracked_files(tmp_path):
    tree = tmp_path / "llama.cpp"
    tree.mkdir()
    (tree / "a.c").write_text("int a;\n")
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "a.c"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    clean = build.source_tree_hash(tree)
    assert build.source_tree_hash(tree) == clean
    (tree / "a.c").write_text("int a = 1;\n")
    edited = build.source_tree_hash(tree)
    assert edited != clean
    (tree / "new.c").write_text("int b;\n")
    assert build.source_tree_hash(tree) not in (clean, edited)


def test_source_hash_outside_git_sees_touched_files(tmp_path):
    (tmp_path / "a.c").write_text("int a;\n")
    before = build.source_tree_hash(tmp_path)
    os.utime(tmp_path / "a.c", ns=(1, 1))
    assert build.source_tree_hash(tmp_path) != before


# --- patch series and the incremental source folder ---------------------------------------

def test_series_lists_existing_patches_in_order(tmp_path):
    (tmp_path / "series").write_text("# comment\n0002-b.patch\n\n0001-a.patch  # trailing\n")
    (tmp_path / "0001-a.patch").write_text("")
    (tmp_path / "0002-b.patch").write_text("")
    assert [p.name for p in build.read_series(tmp_path)] == ["0002-b.patch", "0001-a.patch"]
    (tmp_path / "series").write_text("0003-missing.patch\n")
    with pytest.raises(LlamaBuildError, match="0003-missing.patch does not exist"):
        build.read_series(tmp_path)


def test_the_shipped_series_names_headed_patches():
    patches = build.read_series()
    assert [p.name[:5] for p in patches] == [f"{i:04d}-" for i in range(1, len(patches) + 1)]
    assert len(patches) >= 4
    for patch in patches:
        text = patch.read_text()
        header = text[:text.index("\n--- a/")]
        assert "Test that fails without it" in header and "Upstream" in header
        assert build.patched_paths(patch), patch.name


def _tiny_tree(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.c").write_text("int a = 1;\nint b = 2;\n")
    (root / "src" / "keep.c").write_text("int keep;\n")
    (root / "build").mkdir()
    (root / "build" / "junk.o").write_text("not source")
    return root


PATCH = """Header: why this patch exists.

--- a/src/a.c
+++ b/src/a.c
@@ -1,2 +1,2 @@
 int a = 1;
-int b = 2;
+int b = 3;
"""


@pytest.mark.skipif(not (build.shutil.which("patch") or build.shutil.which("git")), reason="no patch tool")
def test_patched_tree_rewrites_only_changed_files(tmp_path):
    tree = _tiny_tree(tmp_path / "tree")
    patch = tmp_path / "0001-b.patch"
    patch.write_text(PATCH)
    assert build.patched_paths(patch) == ["src/a.c"]
    dest = tmp_path / "work-src"

    stage = tmp_path / "stage1"
    stage.mkdir()
    files = build.patched_file_map(tree, [patch], stage)
    assert "build/junk.o" not in files
    assert build.sync_tree(files, dest) == (2, 0)
    assert (dest / "src" / "a.c").read_text() == "int a = 1;\nint b = 3;\n"
    assert (tree / "src" / "a.c").read_text() == "int a = 1;\nint b = 2;\n"  # source untouched

    os.utime(dest / "src" / "keep.c", ns=(5, 5))
    os.utime(dest / "src" / "a.c", ns=(5, 5))
    stage2 = tmp_path / "stage2"
    stage2.mkdir()
    assert build.sync_tree(build.patched_file_map(tree, [patch], stage2), dest) == (0, 0)
    assert (dest / "src" / "a.c").stat().st_mtime_ns == 5  # same content: not rewritten

    # the patch dropped from the series: a.c goes back to the pristine text, keep.c is untouched
    stage3 = tmp_path / "stage3"
    stage3.mkdir()
    assert build.sync_tree(build.patched_file_map(tree, [], stage3), dest) == (1, 0)
    assert (dest / "src" / "a.c").read_text() == "int a = 1;\nint b = 2;\n"
    assert (dest / "src" / "keep.c").stat().st_mtime_ns == 5
    (tree / "src" / "keep.c").unlink()
    assert build.sync_tree(build.patched_file_map(tree, [], stage3), dest) == (0, 1)


@pytest.mark.skipif(not (build.shutil.which("patch") or build.shutil.which("git")), reason="no patch tool")
def test_a_patch_that_no_longer_applies_is_named(tmp_path):
    tree = _tiny_tree(tmp_path / "tree")
    (tree / "src" / "a.c").write_text("int a = 1;\nint b = 42;\n")  # upstream moved on
    patch = tmp_path / "0007-stale.patch"
    patch.write_text(PATCH)
    stage = tmp_path / "stage"
    stage.mkdir()
    with pytest.raises(LlamaBuildError, match="patch 0007-stale.patch no longer applies"):
        build.patched_file_map(tree, [patch], stage)


# --- CUDA architectures --------------------------------------------------------------------

def test_cuda_arch_named_goes_into_the_flags():
    assert build.cuda_architectures("90", gpu=False) == "90"
    assert build.cuda_architectures("80,86", gpu=False) == "80;86"
    flags = build.cmake_flags("cuda", "linux", cuda_arch="90")
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in flags
    assert not any("CUDA_ARCHITECTURES" in f for f in build.cmake_flags("cpu", "linux", cuda_arch="90"))


def test_cuda_arch_defaults_to_native_only_with_a_gpu():
    assert build.cuda_architectures(None, gpu=True) == "native"
    with pytest.raises(LlamaBuildError, match="--cuda-arch"):
        build.cuda_architectures(None, gpu=False)


def test_cuda_arch_garbage_is_refused_in_one_line():
    with pytest.raises(LlamaBuildError, match="expected compute capabilities") as err:
        build.cuda_architectures("sm_90; rm -rf /", gpu=False)
    assert "\n" not in str(err.value)


# --- configuring again in place -------------------------------------------------------------

def test_a_build_folder_is_reconfigured_in_place_only_when_no_flag_is_dropped():
    old = {"flags": ["-DA=1", "-DB=ON"], "generator": ["-G", "Ninja"], "source": "/s"}
    assert build.reconfigurable(old, {**old, "flags": ["-DA=2", "-DB=ON", "-DC=x"]})   # changed, added
    assert not build.reconfigurable(old, {**old, "flags": ["-DA=1"]})                  # B would stay cached
    assert not build.reconfigurable(old, {**old, "generator": []})
    assert not build.reconfigurable(old, {**old, "source": "/t"})
    assert not build.reconfigurable(None, old)


def test_cublas_from_a_wheel_is_linked_and_found_at_run_time(tmp_path):
    from dflash_gguf.runner import cuda_libs

    toolkit = cuda_libs.Toolkit(tmp_path / "cuda", 13)
    (toolkit.root / "lib64").mkdir(parents=True)
    site = tmp_path / "site"
    with pytest.raises(LlamaBuildError, match=r"pip install 'nvidia-cublas==13\.\*'"):
        cuda_libs.cmake_flags(toolkit, [str(site)])
    lib, inc = site / "nvidia" / "cu13" / "lib", site / "nvidia" / "cu13" / "include"
    lib.mkdir(parents=True)
    inc.mkdir(parents=True)
    (inc / "cublas_v2.h").write_text("")
    for name in ("libcublas.so.13", "libcublasLt.so.13"):
        (lib / name).write_text("")
    flags = cuda_libs.cmake_flags(toolkit, [str(site)])
    assert f"-DCUDA_cublas_LIBRARY={lib / 'libcublas.so.13'}" in flags
    assert f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,{lib} -Wl,-rpath,{lib}" in flags
    assert "-DGGML_CUDA_NO_VMM=ON" in flags  # no driver library here either
    (toolkit.root / "lib64" / "libcublas.so.13").write_text("")
    (toolkit.root / "lib64" / "libcuda.so").write_text("")
    assert cuda_libs.cmake_flags(toolkit, [str(site)]) == []  # a complete toolkit needs nothing


@pytest.mark.parametrize("backend,platform", [("cpu", "linux"), ("cuda", "linux"), ("cpu", "darwin"),
                                              ("metal", "darwin")])
def test_every_build_carries_the_rpc_backend_and_its_server(backend, platform):
    """`--rpc HOST:PORT` needs the RPC backend in the build and `ggml-rpc-server` on each host."""
    assert "-DGGML_RPC=ON" in build.cmake_flags(backend, platform)
    assert "ggml-rpc-server" in build.TARGETS
