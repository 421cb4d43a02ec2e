"""The write scan of ``tests/house/test_output_policy.py``: the calls of one module that write, remove or create a
file or a folder, found with :mod:`ast` (issue 50: of 11 planted writes the earlier scan caught 3).

What counts as a write, after the module's import aliases and simple name assignments are resolved (``import numpy
as n``, ``from shutil import rmtree as rm``, ``f = open``, ``w = Path.write_text``, ``getattr(p, "write_text")``,
``functools.partial(open, mode="w")``):

* an opener whose mode writes (``w``, ``a``, ``x`` or ``+``) or is not a constant (a variable, a keyword from
  ``**options``, an f-string: a write unless every value the module assigns to that name reads): ``open``,
  ``Path.open``, ``io.open``, ``codecs.open``, ``gzip``/``bz2``/``lzma``, ``tarfile.open``, ``zipfile.ZipFile``,
  ``h5py.File``, ``shelve.open``; ``os.open`` with a flag that writes (or flags that are not constants);
* a function that writes wherever it is called (:data:`QUALIFIED`): ``os`` and ``shutil`` file operations,
  ``numpy.save*``, ``torch.save``, ``torch.onnx.export``, ``torch.export.save``, ``torch.jit.save``,
  ``sqlite3.connect``, ``safetensors``, ``nibabel``, ``tifffile``, ``pydicom``, TensorBoard's ``SummaryWriter``,
  ``tempfile.mkstemp``/``mkdtemp``, ``tempfile.NamedTemporaryFile(delete=False)``;
* a method that writes on any object (:data:`METHODS`): ``write_text``, ``savefig``, any ``.save(...)``, pandas'
  ``to_csv``/``to_json`` given a path and ``to_parquet``/``to_excel``, ``mkdir``, ``unlink``, ``Path.rename``, ...;
* ``json``/``yaml``/``pickle.dump`` to a stream.

A write is not reported where it fills a temporary path the output module hands out (a name bound by ``with
<folder>.write(name) as tmp`` or ``with atomic(path) as tmp``, or a path inside it), or writes no file (an
in-memory buffer, ``os.devnull``, ``/proc/self/...``, ``sqlite3.connect(":memory:")``).
"""

from __future__ import annotations

import ast

#: Functions that write, remove or create a file or a folder wherever they are called: module -> names.
QUALIFIED = {
    "os": {"replace", "rename", "renames", "remove", "unlink", "rmdir", "removedirs", "mkdir", "makedirs",
           "symlink", "link", "truncate", "utime", "chmod", "mkfifo"},
    "shutil": {"rmtree", "copy", "copy2", "copyfile", "copytree", "copymode", "copystat", "move", "make_archive",
               "unpack_archive"},
    "numpy": {"save", "savez", "savez_compressed", "savetxt"},
    "torch": {"save"}, "torch.onnx": {"export"}, "torch.export": {"save"}, "torch.jit": {"save"},
    "sqlite3": {"connect"}, "nibabel": {"save"}, "safetensors.torch": {"save_file"},
    "safetensors.numpy": {"save_file"}, "tifffile": {"imwrite", "imsave", "TiffWriter"}, "pydicom": {"dcmwrite"},
    "imageio": {"imwrite", "imsave"}, "cv2": {"imwrite"}, "matplotlib.pyplot": {"savefig"},
    "torch.utils.tensorboard": {"SummaryWriter"}, "tensorboardX": {"SummaryWriter"},
    "tempfile": {"mkstemp", "mkdtemp"},
}
#: Methods that write on any object (``dict.copy()``, ``list.remove()`` and ``str.replace()`` are no such).
METHODS = {"write_text", "write_bytes", "savefig", "to_parquet", "to_excel", "to_pickle", "to_hdf", "to_feather",
           "tofile", "savez", "savez_compressed", "savetxt", "save", "save_file", "rmtree", "copyfile", "copy2",
           "copytree", "touch", "unlink", "rmdir", "mkdir", "symlink_to", "hardlink_to", "chmod", "TiffWriter",
           "imwrite", "save_as", "dcmwrite", "SummaryWriter"}
#: Methods that return text without a path and write a file with one.
PATH_METHODS = {"to_csv", "to_json", "to_markdown", "to_html", "to_latex"}
#: Names that write when called bare, whatever their import.
NAMES = {"save_file", "TiffWriter", "imwrite", "rmtree", "copyfile", "copytree", "dcmwrite", "SummaryWriter"}
#: Openers: qualified name -> the position of their mode argument (its keyword is ``mode``; omitted: a read).
OPENERS = {"open": 1, "io.open": 1, "codecs.open": 1, "gzip.open": 1, "bz2.open": 1, "lzma.open": 1,
           "gzip.GzipFile": 1, "bz2.BZ2File": 1, "lzma.LZMAFile": 1, "tarfile.open": 1, "tarfile.TarFile": 1,
           "zipfile.ZipFile": 1, "zipfile.PyZipFile": 1, "h5py.File": 1, "pathlib.Path.open": 1,
           "io.FileIO": 1, "shelve.open": 1}
STREAM_DUMPS = {("json", "dump"), ("yaml", "dump"), ("yaml", "safe_dump"), ("pickle", "dump"), ("marshal", "dump")}
OS_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC", "O_EXCL", "O_TMPFILE"}
TEMP_HANDERS = {"write", "atomic"}  # OutputFolder.write(name), medattn.outputs.atomic(path)
IN_MEMORY = ("BytesIO", "StringIO")


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return dotted(node.func) + "()"
    return "(...)"


def _getattr(node: ast.AST) -> ast.Attribute | None:
    """``getattr(x, "name")`` as the attribute ``x.name``; None for anything else."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
        return ast.Attribute(value=node.args[0], attr=node.args[1].value, ctx=ast.Load())
    return None


def _imported(node: ast.AST) -> str | None:
    """The module ``require("name", ...)`` or ``importlib.import_module("name")`` returns; None for other values."""
    if isinstance(node, ast.Call) and dotted(node.func).rpartition(".")[2] in ("require", "import_module") \
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


class Names:
    """A module's import aliases and simple name assignments: ``resolve`` gives what a callee may be, qualified."""

    def __init__(self, tree: ast.AST) -> None:
        self.imports: dict[str, str] = {}
        self.assigned: dict[str, list[ast.AST]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    self.imports[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and _imported(node.value):
                        self.imports[target.id] = _imported(node.value)  # x = require("wsidicom", ...)
                    elif isinstance(target, ast.Name):
                        self.assigned.setdefault(target.id, []).append(node.value)
        self.modules = {value.split(".")[0] for value in self.imports.values()}

    def resolve(self, node: ast.AST, depth: int = 0) -> set[str]:
        """The qualified names ``node`` may be (``n.save`` -> ``numpy.save``; ``f`` after ``f = open`` -> ``open``)."""
        node = _getattr(node) or node
        if isinstance(node, ast.Attribute):
            return {f"{owner}.{node.attr}" for owner in self.resolve(node.value, depth)}
        if isinstance(node, ast.Call) and partial_of(node, self) is not None:
            return self.resolve(node.args[0], depth)
        if not isinstance(node, ast.Name):
            return {dotted(node)}
        if node.id in self.imports:
            return {self.imports[node.id]}
        values = [v for v in self.assigned.get(node.id, ()) if isinstance(v, (ast.Name, ast.Attribute))
                  or _getattr(v) or (isinstance(v, ast.Call) and partial_of(v, self) is not None)]
        if not values or depth > 4:
            return {node.id}
        return {node.id}.union(*(self.resolve(v, depth + 1) for v in values))

    def modes(self, node: ast.AST, depth: int = 0) -> set[str] | None:
        """Every value the mode ``node`` may take; None when one is not known (a write, unless proved a read)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.IfExp):
            body, orelse = self.modes(node.body, depth), self.modes(node.orelse, depth)
            return None if body is None or orelse is None else body | orelse
        if isinstance(node, ast.Name) and node.id in self.assigned and depth < 4:
            found = [self.modes(v, depth + 1) for v in self.assigned[node.id]]
            return None if any(m is None for m in found) else set().union(*found)
        return None


def partial_of(call: ast.Call, names: Names) -> ast.Call | None:
    """``functools.partial(f, *args, **keywords)`` as the call ``f(*args, **keywords)``; None for other calls."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if name != "partial" or not call.args:
        return None
    if isinstance(func, ast.Name) and names.imports.get("partial", "functools.partial") != "functools.partial":
        return None
    return ast.Call(func=call.args[0], args=call.args[1:], keywords=call.keywords)


def _argument(call: ast.Call, position: int, keyword: str) -> ast.AST | None:
    if len(call.args) > position and not any(isinstance(a, ast.Starred) for a in call.args[:position + 1]):
        return call.args[position]
    found = next((k.value for k in call.keywords if k.arg == keyword), None)
    if found is None and (any(k.arg is None for k in call.keywords)
                          or any(isinstance(a, ast.Starred) for a in call.args)):
        return ast.Name(id="<**options>", ctx=ast.Load())  # the mode may come in *args or **options
    return found


def _opened_for_writing(call: ast.Call, position: int, names: Names, explicit: bool) -> str | None:
    node = _argument(call, position, "mode")
    if node is None:
        return "a mode left to the caller" if explicit else None
    modes = names.modes(node)
    if modes is None:
        return f"the mode {dotted(node) if not isinstance(node, ast.JoinedStr) else 'f-string'} (not a constant)"
    writing = sorted(m for m in modes if set(m.split(":")[0].split("|")[0]) & set("wax+"))
    return repr(writing[0]) if writing else None


def _os_flags_write(call: ast.Call) -> bool:
    node = _argument(call, 1, "flags")
    if node is None:
        return False
    flags = [n for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))]
    constant = all(isinstance(n, ast.Name) and n.id == "os" or dotted(n).rpartition(".")[2].startswith("O_")
                   for n in flags) and flags
    return not constant or any(dotted(n).rpartition(".")[2] in OS_WRITE_FLAGS for n in flags)


def classify(name: str, call: ast.Call, names: Names, explicit: bool = False) -> str | None:
    """What the call of ``name`` (a qualified name) writes, in words; None when it writes nothing."""
    owner, _, last = name.rpartition(".")
    method = bool(owner) and owner.split(".")[0] not in names.modules  # of an object, not of a module
    if name == "os.open":
        return "os.open with write flags" if _os_flags_write(call) else None
    if name == "torch.onnx.export":  # dynamo=True without f returns the program, which writes nothing
        return name if len(call.args) >= 3 or any(k.arg in ("f", None) for k in call.keywords) else None
    if name in OPENERS or (last == "open" and method):
        if name == "shelve.open":
            node = _argument(call, 1, "flag")
            return "shelve.open" if node is None or names.modes(node) != {"r"} else None
        mode = _opened_for_writing(call, OPENERS.get(name, 0), names, explicit)
        return f"{name}(..., {mode})" if mode else None
    if owner in QUALIFIED and last in QUALIFIED[owner]:
        if name == "sqlite3.connect" and call.args and isinstance(call.args[0], ast.Constant) \
                and call.args[0].value == ":memory:":
            return None
        return name
    if name == "tempfile.NamedTemporaryFile":
        delete = _argument(call, 99, "delete")
        return None if delete is None or (isinstance(delete, ast.Constant) and delete.value is True) \
            else "tempfile.NamedTemporaryFile(delete=False)"
    if (owner.rpartition(".")[2], last) in STREAM_DUMPS:
        return f"{name} to a file" if len(call.args) >= 2 or any(k.arg in ("stream", "fp", "file")
                                                                  for k in call.keywords) else None
    if not owner:
        return name if last in NAMES else None
    if method and last in ("rename", "replace") and len(call.args) == 1 \
            and not isinstance(call.args[0], ast.Constant):
        return f"Path.{last}"
    if last == "save" and owner.rpartition(".")[2] == "checkpoint":
        return None  # the checkpoint writer's own entry point
    if last in METHODS or (last in PATH_METHODS and (call.args or any(k.arg == "path_or_buf" for k in call.keywords))):
        return name
    return None


def writes(call: ast.Call, names: Names, explicit: bool = False) -> str | None:
    """What ``call`` writes, removes or creates, in words; None when it writes nothing."""
    inner = partial_of(call, names)
    if inner is not None:
        found = writes(inner, names, explicit=True)
        return f"functools.partial({found})" if found else None
    for name in sorted(names.resolve(_getattr(call.func) or call.func)):
        found = classify(name, call, names, explicit)
        if found:
            return found
    return None


def _names(node: ast.AST) -> set[str]:
    """The names ``node`` refers to as a path: ``tmp``, ``str(tmp)``, ``f"{tmp}"``, ``tmp / "x"``."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("str", "Path"):
        return set().union(*(_names(a) for a in node.args)) if node.args else set()
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _names(node.left)
    if isinstance(node, ast.JoinedStr):
        return set().union(set(), *(_names(v.value) for v in node.values if isinstance(v, ast.FormattedValue)))
    return set()


def _no_file(call: ast.Call, buffers: set[str]) -> bool:
    """Whether ``call`` writes into memory or a device, not a file."""
    arguments = [*call.args, *(k.value for k in call.keywords)]
    if isinstance(call.func, ast.Attribute):
        arguments.append(call.func.value)
    for node in arguments:
        if dotted(node) == "os.devnull" or (isinstance(node, ast.Name) and node.id in buffers):
            return True
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and str(node.args[0].value).startswith("/proc/"):
            return True
        if isinstance(node, ast.Constant) and str(node.value).startswith("/proc/"):
            return True
    return False


class Scan(ast.NodeVisitor):
    """The writing calls of one module that the output module did not hand a temporary path to."""

    def __init__(self, names: Names) -> None:
        self.names = names
        self.found: list[tuple[int, str, str]] = []  # (line, function, what)
        self._function = ["<module>"]
        self._temps: list[set[str]] = [set()]
        self._buffers: list[set[str]] = [set()]

    def visit_FunctionDef(self, node) -> None:
        self._function.append(node.name)
        self._buffers.append({t.id for n in ast.walk(node) if isinstance(n, ast.Assign)
                              and isinstance(n.value, ast.Call) and dotted(n.value.func).endswith(IN_MEMORY)
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
        what = writes(node, self.names)
        if what is not None:
            temps = set().union(*self._temps)
            arguments = [*node.args, *(k.value for k in node.keywords)]
            func = _getattr(node.func) or node.func
            if isinstance(func, ast.Attribute):
                arguments.append(func.value)
            handed = any(_names(a) & temps for a in arguments)
            if not handed and not _no_file(node, self._buffers[-1]):
                self.found.append((node.lineno, self._function[-1], what))
        self.generic_visit(node)


def scan(code: str) -> list[tuple[int, str, str]]:
    """Each write of the module ``code`` that no temporary path of the output module receives: (line, function,
    what it writes)."""
    tree = ast.parse(code)
    visitor = Scan(Names(tree))
    visitor.visit(tree)
    return visitor.found

