"""One GGUF reader (issue 50): every GGUF the product opens is read by dflash_gguf/gguf/reader.py. No module
outside dflash_gguf/gguf/ imports gguf-py's reader, holds the GGUF magic, unpacks binary data with
`struct`, or works out where a tensor lies from the reader's `data_offset` (train/frozen.py once read
its target through gguf-py's GGUFReader, and convert/mask_embedding.py read tensor rows at offsets it
computed, so a change to how a GGUF is read missed both).

Every module of the package is parsed (ast, nothing is imported), the ones inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO
from tests.house.test_layers import _modules

GGUF_DIR = REPO / "dflash_gguf" / "gguf"
READER_NAMES = {"GGUFReader", "gguf_reader"}
UNPACKING = {"unpack", "unpack_from", "iter_unpack", "Struct"}


def _is_data_offset(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "data_offset"


def own_gguf_reading(path: Path) -> list[str]:
    """`file:line: what` for each place the module reads GGUF bytes by itself, in line order."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        what = None
        if isinstance(node, ast.Import):
            if any(a.name.split(".")[:2] == ["gguf", "gguf_reader"] for a in node.names):
                what = "imports gguf-py's reader"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = {a.name for a in node.names}
            if node.module.split(".")[0] == "gguf" and (READER_NAMES & (set(node.module.split(".")) | names)):
                what = "imports gguf-py's reader"
            elif node.module == "struct" and names & UNPACKING:
                what = "unpacks bytes with struct"
        elif isinstance(node, ast.Attribute) and node.attr in READER_NAMES:
            what = "uses gguf-py's reader"
        elif isinstance(node, ast.Attribute) and node.attr in UNPACKING \
                and isinstance(node.value, ast.Name) and node.value.id == "struct":
            what = "unpacks bytes with struct"
        elif isinstance(node, ast.Constant) and isinstance(node.value, bytes) and b"GGUF" in node.value:
            what = "holds the GGUF magic"
        elif isinstance(node, ast.BinOp) and (_is_data_offset(node.left) or _is_data_offset(node.right)):
            what = "computes a position in a GGUF from data_offset"
        if what:
            found.add((node.lineno, what))
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    return [f"{shown}:{line}: {what}" for line, what in sorted(found)]


def test_no_module_outside_the_gguf_folder_reads_gguf_bytes():
    found = [hit for path, _, _ in _modules() if not path.is_relative_to(GGUF_DIR) for hit in own_gguf_reading(path)]
    assert found == [], ("GGUF bytes read outside dflash_gguf/gguf/ (read them through dflash_gguf/gguf/reader.py's "
                         "GGUFFile: get, tensors, tensor_rows, tensor_span; add what is missing there):\n"
                         + "\n".join(found))


def test_the_scan_covers_the_product_outside_the_gguf_folder():
    scanned = {path.relative_to(REPO).as_posix() for path, _, _ in _modules() if not path.is_relative_to(GGUF_DIR)}
    assert {"train/frozen.py", "convert/mask_embedding.py", "convert/legacy.py", "dflash_gguf/hub/resolve.py",
            "validation/doctor.py", "quantize/quantize.py", "release/file_names.py"} <= scanned


def test_the_scan_sees_each_way_of_reading_a_gguf(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import struct\nfrom gguf import GGUFReader\nimport gguf.gguf_reader\n"
        "def f(path, g):\n"
        "    from gguf.gguf_reader import ReaderField\n"
        "    reader = gguf.GGUFReader(path)\n"
        "    magic = open(path, 'rb').read(4) == b'GGUF'\n"
        "    (n,) = struct.unpack('<Q', b'12345678')\n"
        "    return g.data_offset + g.tensors['x'].offset\n")
    assert own_gguf_reading(module) == [
        "m.py:2: imports gguf-py's reader", "m.py:3: imports gguf-py's reader", "m.py:5: imports gguf-py's reader",
        "m.py:6: uses gguf-py's reader", "m.py:7: holds the GGUF magic", "m.py:8: unpacks bytes with struct",
        "m.py:9: computes a position in a GGUF from data_offset"]


def test_the_scan_lets_the_rest_of_gguf_py_and_reading_the_reader_alone(tmp_path):
    """gguf-py's constants, writer and quants stay usable, and so does the reader's own answer."""
    module = tmp_path / "m.py"
    module.write_text("import struct\nimport gguf\nfrom gguf import GGUFWriter, GGMLQuantizationType\n"
                      "from gguf.quants import dequantize\n"
                      "def f(g):\n    log(g.data_offset)\n    return struct.pack('<I', 1), b'GGML'\n")
    assert own_gguf_reading(module) == []
