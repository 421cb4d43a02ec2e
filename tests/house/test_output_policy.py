"""The output policy, enforced: only the output module writes files (docs/guarantees.md, issue 39).

Static half: every module under ``src/medattn`` is read with :mod:`ast` (``write_scan.py`` beside this file: import
aliases and simple name assignments resolved, a mode that is not a constant counted as a write); a call that writes,
removes or creates a file or a folder (an opener with a mode that writes, ``os.open`` with write flags,
``zipfile``/``tarfile``/``h5py`` for writing, ``write_text``, ``savefig``, any ``.save(...)``, ``torch.save``,
``torch.onnx.export`` to a path, ``np.save*``, pandas' ``to_*`` writers, ``sqlite3.connect``, ``mkdir``/
``os.makedirs``, ``shutil``'s copies, moves and removals, ``os.replace``/``symlink``/``link``/``truncate``/``utime``,
``tempfile.NamedTemporaryFile(delete=False)``, TensorBoard's ``SummaryWriter``, ...) is allowed only

* in :mod:`medattn.outputs` (the policy and its primitives), :mod:`medattn.runtime.checkpoint` (the
  checkpoint writer) and :mod:`medattn.train.rundir` (train's run-folder transaction);
* where it writes the temporary path the output module hands out: an argument bound by
  ``with <folder>.write(name) as tmp`` or ``with atomic(path) as tmp`` around the call (a format's own writer,
  PIL, nibabel, h5py, tifffile, torch.export, fills the file; the module renames it into place);
* where it writes no file: an in-memory buffer (``io.BytesIO()``, ``io.StringIO()``), ``os.devnull``,
  ``/proc/self/...``;
* in :data:`SCRATCH`, named with its reason.

Each checker is also fed planted snippets (:data:`BAD`, every form above), so that it is seen to fail, and
read-only look-alikes (:data:`GOOD`). The behavioural half (every command run twice into one folder holding a user's
file, each write heard by an audit hook, ``tests/write_audit.py``) is ``tests/core/test_output_commands.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from write_scan import scan

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "medattn"

#: Modules that may write anywhere (paths relative to src/medattn).
WRITERS = {"outputs.py": "the output policy and its primitives",
           "runtime/checkpoint.py": "the checkpoint writer (a folder renamed into place)",
           "train/rundir.py": "train's run-folder transaction (--overwrite sets the previous run aside)"}

#: (module, function) -> why its writes are no output of a command.
SCRATCH: dict[tuple[str, str], str] = {}  # bench/common.py:run_isolated reads its child through pipes (issue 50)


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
    assert violations() == [], ("write through medattn.outputs.OutputFolder (the command's, or "
                                "OutputFolder.within(folder) for a folder whose policy its caller applied)")


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
    # issue 50: forms the scan missed
    "open_mode_name": "def f(p, mode):\n    open(p, mode)\n",
    "open_mode_keyword": "def f(p, m):\n    open(p, mode=m)\n",
    "open_mode_fstring": "def f(p, k):\n    open(p, f'{k}b')\n",
    "open_mode_options": "def f(p, **options):\n    open(p, **options)\n",
    "open_mode_ifexp": "def f(p, more):\n    open(p, 'a' if more else 'r')\n",
    "path_open_mode_name": "def f(p, mode):\n    p.open(mode)\n",
    "os_open": "import os\ndef f(p):\n    os.open(p, os.O_WRONLY | os.O_CREAT)\n",
    "os_open_flags_name": "import os\ndef f(p, flags):\n    os.open(p, flags)\n",
    "io_open": "import io\ndef f(p):\n    io.open(p, 'w')\n",
    "codecs_open": "import codecs\ndef f(p):\n    codecs.open(p, 'w', 'utf-8')\n",
    "gzip_open": "import gzip\ndef f(p):\n    gzip.open(p, 'wt')\n",
    "zipfile_w": "import zipfile\ndef f(p):\n    zipfile.ZipFile(p, 'w')\n",
    "zipfile_a_from": "from zipfile import ZipFile\ndef f(p):\n    ZipFile(p, mode='a')\n",
    "zipfile_x": "import zipfile as z\ndef f(p):\n    z.ZipFile(p, 'x')\n",
    "tarfile_w": "import tarfile\ndef f(p):\n    tarfile.open(p, 'w:gz')\n",
    "h5py_mode_name": "import h5py\ndef f(p, m):\n    h5py.File(p, m)\n",
    "torch_save": "import torch\ndef f(m, p):\n    torch.save(m.state_dict(), p)\n",
    "onnx_export": "import torch\ndef f(m, x, p):\n    torch.onnx.export(m, (x,), p)\n",
    "onnx_export_f": "from torch import onnx\ndef f(m, x, p):\n    onnx.export(m, (x,), f=p, dynamo=True)\n",
    "torch_export_save": "import torch\ndef f(program, p):\n    torch.export.save(program, p)\n",
    "jit_save": "from torch import jit\ndef f(s, p):\n    jit.save(s, p)\n",
    "np_alias": "import numpy as n\ndef f(p, a):\n    n.savetxt(p, a)\n",
    "np_from_alias": "from numpy import savez as keep\ndef f(p, a):\n    keep(p, a=a)\n",
    "pil_image_save": "from PIL import Image\ndef f(a, p):\n    Image.fromarray(a).save(p)\n",
    "to_parquet": "def f(frame, p):\n    frame.to_parquet(p)\n",
    "to_excel": "def f(frame, p):\n    frame.to_excel(p, index=False)\n",
    "to_json": "def f(frame, p):\n    frame.to_json(p)\n",
    "sqlite": "import sqlite3\ndef f(p):\n    sqlite3.connect(p)\n",
    "makedirs": "import os\ndef f(p):\n    os.makedirs(p, exist_ok=True)\n",
    "path_mkdir": "def f(p):\n    p.mkdir(parents=True, exist_ok=True)\n",
    "shutil_copy": "import shutil\ndef f(a, b):\n    shutil.copy(a, b)\n",
    "shutil_copy2_from": "from shutil import copy2\ndef f(a, b):\n    copy2(a, b)\n",
    "shutil_move": "import shutil\ndef f(a, b):\n    shutil.move(a, b)\n",
    "rmtree_alias": "from shutil import rmtree as rm\ndef f(p):\n    rm(p)\n",
    "rmtree_required": "def f(p):\n    sh = require('shutil', 'cleaning')\n    sh.rmtree(p)\n",
    "os_symlink": "import os\ndef f(a, b):\n    os.symlink(a, b)\n",
    "os_link": "import os\ndef f(a, b):\n    os.link(a, b)\n",
    "os_truncate": "import os\ndef f(p):\n    os.truncate(p, 0)\n",
    "os_utime": "import os\ndef f(p):\n    os.utime(p)\n",
    "named_temporary": "import tempfile\ndef f():\n    tempfile.NamedTemporaryFile(suffix='.x', delete=False)\n",
    "mkdtemp": "import tempfile\ndef f():\n    tempfile.mkdtemp()\n",
    "summary_writer": "from torch.utils.tensorboard import SummaryWriter\ndef f(p):\n    SummaryWriter(p)\n",
    "assigned_method": "from pathlib import Path\nw = Path.write_text\ndef f(p, s):\n    w(p, s)\n",
    "assigned_open": "f = open\ndef g(p):\n    f(p, 'w')\n",
    "getattr": "def f(p):\n    getattr(p, 'write_text')('x')\n",
    "getattr_module": "import os\ndef f(p):\n    getattr(os, 'remove')(p)\n",
    "partial_open": "import functools\ndef f(p):\n    functools.partial(open, mode='w')(p)\n",
    "partial_assigned": "from functools import partial\nkeep = partial(open, mode='a')\ndef f(p):\n    keep(p)\n",
    "partial_mode_later": "from functools import partial\ndef f(p):\n    partial(open, p)\n",
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
    # issue 50: read-only look-alikes of the forms above
    "open_read": "def f(p):\n    open(p); open(p, 'rb'); open(p, mode='rt', encoding='utf-8')\n",
    "mode_constant": "READ = 'rb'\ndef f(p):\n    open(p, READ)\n",
    "mode_ifexp_read": "def f(p, binary):\n    open(p, 'rb' if binary else 'r')\n",
    "h5py_read": "import h5py\ndef f(p):\n    h5py.File(p, 'r')\n",
    "zipfile_read": "import zipfile\ndef f(p):\n    zipfile.ZipFile(p); zipfile.ZipFile(p, 'r')\n",
    "tarfile_read": "import tarfile\ndef f(p):\n    tarfile.open(p, 'r:xz')\n",
    "os_open_read": "import os\ndef f(p):\n    os.open(p, os.O_RDONLY | os.O_CLOEXEC)\n",
    "dict_copy": "def f(d, l):\n    d.copy(); l.remove(0); d.pop('x')\n",
    "dataclass_replace": "from dataclasses import replace\ndef f(x):\n    replace(x, a=1)\n",
    "module_open": "from PIL import Image\ndef f(p, q):\n    Image.open(p)\n    w = require('wsidicom', 'x')\n"
                   "    w.WsiDicom.open(q)\n",
    "loads": "import numpy as np, torch\ndef f(p):\n    np.load(p); torch.load(p); h5py.File(p)\n",
    "onnx_program": "import torch\ndef f(m, x):\n    torch.onnx.export(m, (x,), dynamo=True)\n",
    "sqlite_memory": "import sqlite3\ndef f():\n    sqlite3.connect(':memory:')\n",
    "named_temporary_deleted": "import tempfile\ndef f():\n    tempfile.NamedTemporaryFile(suffix='.x')\n",
    "to_text": "def f(frame):\n    frame.to_csv(); frame.to_json(orient='records')\n",
    "partial_read": "from functools import partial\ndef f(p):\n    partial(open, mode='rb')\n",
    "getattr_read": "def f(p):\n    getattr(p, 'read_text')()\n",
    "temp_folder": "def f(out, p):\n    with atomic(p) as tmp:\n        (tmp / 'a').mkdir(parents=True)\n",
    "temp_onnx": "import torch\ndef f(out, m, x):\n    with out.write('m.onnx') as tmp:\n"
                 "        torch.onnx.export(m, (x,), tmp)\n",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_the_scan_finds_a_write(name):
    assert scan(BAD[name]), f"the scan missed {name}: {BAD[name]!r}"


@pytest.mark.parametrize("name", sorted(GOOD))
def test_the_scan_leaves_what_writes_no_output(name):
    assert scan(GOOD[name]) == []


def test_a_module_with_a_write_fails(tmp_path):
    (tmp_path / "outputs.py").write_text("def f(p):\n    p.write_text('x')\n")
    (tmp_path / "sneaky.py").write_text("import shutil\ndef g(p):\n    shutil.rmtree(p)\n")
    assert violations(tmp_path) == ["src/medattn/sneaky.py:3 (g): shutil.rmtree"]


def test_the_output_module_imports_only_errors():
    """Every layer above the ground floor imports it (docs/architecture.md), so it stands on nothing but ``errors``."""
    tree = ast.parse((PACKAGE / "outputs.py").read_text(encoding="utf-8"))
    names = {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {name for name in names if name.startswith("medattn")} == {"medattn.errors"}


def test_the_primitives_write_atomically_and_the_modes_differ(tmp_path):
    from medattn import outputs
    from medattn.errors import UserError

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
