"""A Python for Spark executors that does NOT have kgroup or kgroup_pipeline on its path.

Rule: the pipeline must not depend on the executors finding the driver's source tree; the
job ships its code as a zip (``SparkContext.addPyFile``). To prove it here, where every
process would otherwise find the editable install, :func:`bare_python` writes an
interpreter wrapper (``PYSPARK_PYTHON`` / ``KGROUP_PYSPARK_PYTHON``) that, when it runs as
an executor's Python (``SPARK_EXECUTOR_DIRS`` is set by the standalone worker for its
executors), removes the editable finder and the repository's source directories before
running ``-m module`` / ``-c code``. Driver-side Python processes (the streaming source's
planner) run on the driver's machine, where the package is installed, and keep it.
Each call is appended to ``calls.log`` next to the wrapper.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_WRAPPER = '''\
import os, runpy, sys
REPO, LOG = sys.argv.pop(1), sys.argv.pop(1)
executor = "SPARK_EXECUTOR_DIRS" in os.environ
with open(LOG, "a") as f:
    f.write(f"{os.getpid()} executor={executor} {' '.join(sys.argv[1:])}\\n")
if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)
if executor:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path_hooks[:] = [h for h in sys.path_hooks if "editable" not in repr(h).lower()]
    sys.path_importer_cache.clear()
    sys.path[:] = [p for p in sys.path
                   if p.endswith(".zip") or "/.venv/" in p or not p.startswith(REPO)]
args = sys.argv[1:]
while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
    args.pop(0)
if args[:1] == ["-c"]:
    sys.argv = ["-c", *args[2:]]
    exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
else:
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
'''


def bare_python(directory: Path) -> Path:
    """Write the wrapper into `directory`; returns the executable to use as the Python."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "bare_python.py"
    script.write_text(_WRAPPER)
    exe = directory / "python"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "{REPO}" '
                   f'"{directory / "calls.log"}" "$@"\n')
    exe.chmod(0o755)
    return exe
