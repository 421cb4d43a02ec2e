"""The output policy, enforced: only the output module writes files (docs/guarantees.md, issue 39).

Static half: every module under ``src/medattn`` is read with :mod:`ast`; a call that writes or removes a file or a
folder (``open(..., "w"/"a"/"x"/"+")``, ``Path.open("w")``, ``write_text``, ``write_bytes``, ``savefig``,
``h5py.File(..., "w"/"a"/"r+")``, ``json.dump``/``yaml.dump`` to a stream, ``np.save*``, ``save_file``, ``nib.save``,
any ``.save(...)``, ``to_csv``, ``TiffWriter``, ``shutil.rmtree``/``copy*``/``move``, ``os.replace``/``rename``/
``remove``, ``Path.rename``/``replace``/``unlink``/``touch``) is allowed only

* in :mod:`medattn.runtime.outputs` (the policy and its primitives), :mod:`medattn.runtime.checkpoint` (the
  checkpoint writer) and :mod:`medattn.train.rundir` (train's run-folder transaction);
* where it writes the temporary path the output module hands out: an argument bound by
  ``with <folder>.write(name) as tmp`` or ``with atomic(path) as tmp`` around the call (a format's own writer,
  PIL, nibabel, h5py, tifffile, torch.export, fills the file; the module renames it into place);
* where it writes no file: an in-memory buffer (``io.BytesIO()``, ``io.StringIO()``), ``os.devnull``,
  ``/proc/self/...``;
* in :data:`SCRATCH`, named with its reason.

Each checker is also fed fake snippets, so that it is seen to fail. The behavioural half (every command run twice
into one folder holding a user's file) is ``tests/runtime/test_output_commands.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "medattn"

#: Modules that may write anywhere (paths relative to src/medattn).
WRITERS = {"runtime/outputs.py": "the output policy and its primitives",
           "runtime/checkpoint.py": "the checkpoint writer (a folder renamed into place)",
           "train/rundir.py": "train's run-folder transaction (--overwrite sets the previous run aside)"}

#: (module, function) -> why its writes are no output of a command.
SCRATCH: dict[tuple[str, str], str] = {}  # bench/common.py:run_isolated reads its child through pipes (issue 50)

ATTRIBUTE_WRITERS = {"write_text", "write_bytes", "savefig", "to_csv", "tofile", "savez", "savez_compressed",
                     "savetxt", "save", "save_file", "rmtree", "copyfile", "copy", "copy2", "copytree", "move",
                     "unlink", "touch", "remove", "TiffWriter", "imwrite", "save_as", "dcmwrite"}
NAME_WRITERS = {"save_file", "TiffWriter", "imwrite", "rmtree", "copyfile", "copytree", "dcmwrite"}
STREAM_DUMPS = {("json", "dump"), ("yaml", "dump"), ("yaml", "safe_dump"), ("pickle", "dump")}
H5_WRITE_MODES = {"w", "a", "w-", "x", "r+"}
TEMP_HANDERS = {"write", "atomic"}
IN_MEMORY = ("BytesIO", "StringIO")  # OutputFolder.write(name), runtime.outputs.atomic(path)


def _mode(call: ast.Call, position: int) -> str | None:
    node = call.args[position] if len(call.args) > position else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func) + "()"
    return "?"


def writes(call: ast.Call) -> str | None:
    """What ``call`` writes or removes, in words; None when it writes nothing."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    owner = _dotted(func.value) if isinstance(func, ast.Attribute) else ""
    if name == "open":
        mode = _mode(call, 0 if isinstance(func, ast.Attribute) and owner not in ("io", "gzip", "bz2", "lzma")
                     else 1)
        return f"open(..., {mode!r})" if mode and set(mode) & set("wax+") else None
    if name == "File" and owner.endswith("h5py"):
        return f"h5py.File(..., {_mode(call, 1)!r})" if _mode(call, 1) in H5_WRITE_MODES else None
    if (owner.rpartition(".")[2], name) in STREAM_DUMPS:
        return f"{owner}.{name} to a file" if len(call.args) >= 2 or any(k.arg == "stream" for k in call.keywords) \
            else None
    if owner == "os" and name in ("replace", "rename", "remove", "unlink", "rmdir", "removedirs"):
        return f"os.{name}"
    if name in ("rename", "replace") and isinstance(func, ast.Attribute) and len(call.args) == 1 \
            and not isinstance(call.args[0], ast.Constant):
        return f"Path.{name}"
    if name == "save" and owner == "checkpoint":
        return None  # the checkpoint writer's own entry point
    if isinstance(func, ast.Attribute) and name in ATTRIBUTE_WRITERS:
        if name in ("copy", "move", "remove") and owner != "shutil":
            return None  # dict.copy(), list.remove(), ...
        return f"{owner}.{name}"
    if isinstance(func, ast.Name) and name in NAME_WRITERS:
        return name
    return None


def _names(node: ast.AST) -> set[str]:
    """The names ``node`` refers to as a path: ``tmp``, ``str(tmp)``, ``f"{tmp}"``."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("str", "Path"):
        return set().union(*(_names(a) for a in node.args)) if node.args else set()
    return set()


def _no_file(call: ast.Call, buffers: set[str]) -> bool:
    """Whether ``call`` writes into memory or a device, not a file."""
    arguments = [*call.args, *(k.value for k in call.keywords)]
    if isinstance(call.func, ast.Attribute):
        arguments.append(call.func.value)
    for node in arguments:
        if _dotted(node) == "os.devnull" or (isinstance(node, ast.Name) and node.id in buffers):
            return True
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and str(node.args[0].value).startswith("/proc/"):
            return True
        if isinstance(node, ast.Constant) and str(node.value).startswith("/proc/"):
            return True
    return False


class Scan(ast.NodeVisitor):
    """The writing calls of one module that the output module did not hand a temporary path to."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str, str]] = []  # (line, function, what)
        self._function = ["<module>"]
        self._temps: list[set[str]] = [set()]
        self._buffers: list[set[str]] = [set()]

    def visit_FunctionDef(self, node) -> None:
        self._function.append(node.name)
        self._buffers.append({t.id for n in ast.walk(node) if isinstance(n, ast.Assign)
                              and isinstance(n.value, ast.Call) and _dotted(n.value.func).endswith(IN_MEMORY)
                              for t in n.targets if isinstance(t, ast.Name)})
        self.generic_visit(node)
        self._buffers.pop()
        self._function.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_With(self, node) -> None:
        bound: set[str] = set()
        for item in node.items:
            self._temps.append(bound.copy())
            self.visit(item.context_expr)
            self._temps.pop()
            expr = item.context_expr
            if isinstance(expr, ast.Call) and isinstance(item.optional_vars, ast.Name):
                func = expr.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name in TEMP_HANDERS:
                    bound.add(item.optional_vars.id)
        self._temps.append(bound)
        for statement in node.body:
            self.visit(statement)
        self._temps.pop()

    def visit_Call(self, node) -> None:
        what = writes(node)
        if what is not None:
            temps = set().union(*self._temps)
            arguments = [*node.args, *(k.value for k in node.keywords)]
            if isinstance(node.func, ast.Attribute):
                arguments.append(node.func.value)
            handed = any(_names(a) & temps for a in arguments)
            if not handed and not _no_file(node, self._buffers[-1]):
                self.found.append((node.lineno, self._function[-1], what))
        self.generic_visit(node)


def scan(code: str) -> list[tuple[int, str, str]]:
    visitor = Scan()
    visitor.visit(ast.parse(code))
    return visitor.found


def violations(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        if module in WRITERS:
            continue
        for line, function, what in scan(path.read_text(encoding="utf-8")):
            if (module, function) not in SCRATCH:
                found.append(f"src/medattn/{module}:{line} ({function}): {what}")
    return found


def test_only_the_output_module_writes_files():
    assert violations() == [], ("write through medattn.runtime.outputs (OutputFolder, or its primitives atomic, "
                                "save_text, save_json, save_csv, save_figure, save_image, remove)")


def test_every_scratch_entry_is_used():
    for (module, function), _ in SCRATCH.items():
        found = [f for _, f, _ in scan((PACKAGE / module).read_text(encoding="utf-8"))]
        assert function in found, f"SCRATCH names {module}:{function}, which writes nothing any more"


def test_every_writer_module_exists():
    assert all((PACKAGE / module).is_file() for module in WRITERS)


BAD = {
    "open_w": "def f(p):\n    with open(p, 'w') as h:\n        h.write('x')\n",
    "open_a_kw": "def f(p):\n    open(p, mode='a')\n",
    "path_open": "def f(p):\n    p.open('w', newline='')\n",
    "write_text": "def f(p):\n    p.write_text('x')\n",
    "write_bytes": "def f(p):\n    p.write_bytes(b'x')\n",
    "savefig": "def f(fig, p):\n    fig.savefig(p, dpi=100)\n",
    "h5py_w": "import h5py\ndef f(p):\n    h5py.File(p, 'w')\n",
    "h5py_a": "import h5py\ndef f(p):\n    h5py.File(p, mode='a')\n",
    "rmtree": "import shutil\ndef f(p):\n    shutil.rmtree(p)\n",
    "os_replace": "import os\ndef f(a, b):\n    os.replace(a, b)\n",
    "path_replace": "def f(a, b):\n    a.replace(b)\n",
    "np_save": "import numpy as np\ndef f(p, a):\n    np.save(p, a)\n",
    "savez": "import numpy as np\ndef f(p, a):\n    np.savez_compressed(p, a=a)\n",
    "save_file": "from safetensors.torch import save_file\ndef f(t, p):\n    save_file(t, p)\n",
    "nib_save": "import nibabel as nib\ndef f(i, p):\n    nib.save(i, p)\n",
    "pil_save": "def f(image, p):\n    image.save(p, format='PNG')\n",
    "to_csv": "def f(frame, p):\n    frame.to_csv(p)\n",
    "json_dump": "import json\ndef f(p):\n    with open(p) as h:\n        json.dump({}, h)\n",
    "yaml_dump": "import yaml\ndef f(h):\n    yaml.safe_dump({}, h)\n",
    "tiff": "def f(tifffile, p):\n    tifffile.TiffWriter(p)\n",
    "unlink": "def f(p):\n    p.unlink()\n",
    "wrong_with": "def f(out, p):\n    with out.write('x') as tmp:\n        open(p, 'w')\n",
    "after_with": "def f(out):\n    with out.write('x') as tmp:\n        pass\n    open(tmp, 'w')\n",
    "other_cm": "def f(p):\n    with lock(p) as tmp:\n        tmp.write_text('x')\n",
}

GOOD = {
    "read": "def f(p):\n    open(p).read(); open(p, 'rb'); p.open(); p.read_text()\n",
    "h5py_r": "import h5py\ndef f(p):\n    h5py.File(p, 'r'); h5py.File(p)\n",
    "temp": "def f(out, image):\n    with out.write('x.png') as tmp:\n        image.save(tmp, format='PNG')\n",
    "temp_str": "def f(out, program):\n    with out.write('x.pt2') as tmp:\n        program.save(str(tmp))\n",
    "temp_items": "def f(out):\n    with out.write('x.csv') as tmp, open(tmp, 'w', newline='') as h:\n"
                  "        h.write('x')\n",
    "atomic": "def f(p, i):\n    with atomic(p) as tmp:\n        nib.save(i, str(tmp))\n",
    "buffer": "import io\ndef f(fig):\n    b = io.BytesIO()\n    fig.savefig(b, format='png')\n",
    "devnull": "import os\ndef f():\n    open(os.devnull, 'w')\n",
    "proc": "from pathlib import Path\ndef f():\n    Path('/proc/self/clear_refs').write_text('5')\n",
    "strings": "def f(s, d, l):\n    s.replace('a', 'b'); d.copy(); l.remove(1); json.dumps({})\n",
    "checkpoint": "def f(checkpoint, m):\n    checkpoint.save('x', m, {})\n",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_the_scan_finds_a_write(name):
    assert scan(BAD[name]), f"the scan missed {name}: {BAD[name]!r}"


@pytest.mark.parametrize("name", sorted(GOOD))
def test_the_scan_leaves_what_writes_no_output(name):
    assert scan(GOOD[name]) == []


def test_a_module_with_a_write_fails(tmp_path):
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "outputs.py").write_text("def f(p):\n    p.write_text('x')\n")
    (tmp_path / "sneaky.py").write_text("import shutil\ndef g(p):\n    shutil.rmtree(p)\n")
    assert violations(tmp_path) == ["src/medattn/sneaky.py:3 (g): shutil.rmtree"]


def test_the_output_module_imports_only_errors():
    """Layers below runtime may import it (docs/architecture.md), so it must stay above nothing but ``errors``."""
    tree = ast.parse((PACKAGE / "runtime" / "outputs.py").read_text(encoding="utf-8"))
    names = {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {name for name in names if name.startswith("medattn")} == {"medattn.errors"}


def test_the_primitives_write_atomically_and_the_modes_differ(tmp_path):
    from medattn.errors import UserError
    from medattn.runtime import outputs

    with pytest.raises(RuntimeError), outputs.atomic(tmp_path / "a" / "x.csv") as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert list((tmp_path / "a").iterdir()) == []
    fields = ("epoch", "loss")
    outputs.append_csv(tmp_path / "m.csv", [{"epoch": 1, "loss": 0.5}], fields)
    outputs.append_csv(tmp_path / "m.csv", [{"epoch": 2, "loss": 0.25}], fields)
    assert (tmp_path / "m.csv").read_text().splitlines() == ["epoch,loss", "1,0.5", "2,0.25"]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "cv.json").write_text("old")
    with pytest.raises(UserError, match="did not write it"):
        outputs.OutputFolder(tmp_path / "b").save_json("cv.json", {})
    outputs.OutputFolder(tmp_path / "b", resume=True).save_json("cv.json", {"k": 1})
    assert (tmp_path / "b" / "cv.json").read_text() == '{\n "k": 1\n}'
    outputs.remove(tmp_path / "b")
    assert not (tmp_path / "b").exists()
