"""The job's own code travels with the job to the executors.

With the subtasks on the executors, the operators of a job (and its tracer) are pickled in
the driver and unpickled in the executors' Python workers. Pickle names a class by its
module, and an executor can import only what is installed there: the Python installation's
libraries, spark-ckpt itself, and (in a notebook or a script) ``__main__``, which
cloudpickle ships by value anyway. A class defined in a module of the job's own project —
``myjob/operators.py`` next to the driver script, a test module — is not importable there.
Spark's answer is ``addPyFile`` (classic) or ``addArtifacts(pyfile=True)`` (Connect); for
the classes a job hands to spark-ckpt, :func:`ship_by_value` does it for the user: such
modules are pickled by value (``cloudpickle.register_pickle_by_value``), as Databricks does
for notebook code. Modules of installed libraries are left alone: install them on the
executors as for any PySpark job.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from spark_ckpt.runtime.operator import KeyedOperator

#: Top-level packages the executors import as installed: spark-ckpt's own.
OWN_PACKAGES = frozenset({"spark_ckpt", "datasources"})


def _library_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    return [Path(paths[n]).resolve() for n in names if n in paths]


def job_modules(objects: Iterable[object]) -> list[ModuleType]:
    """The modules defining the classes of *objects* — and of the operators they hold,
    wrapped operators included — that are the job's own code (see the module docstring)."""
    libraries = _library_dirs()
    found: dict[str, ModuleType] = {}
    seen: set[int] = set()

    def visit(obj: object, depth: int) -> None:
        if id(obj) in seen or depth > 4:
            return
        seen.add(id(obj))
        for cls in type(obj).__mro__:
            module = sys.modules.get(cls.__module__)
            if module is not None and _is_job_code(module, libraries):
                found.setdefault(module.__name__, module)
        if isinstance(obj, KeyedOperator):
            for value in vars(obj).values():
                if isinstance(value, KeyedOperator):
                    visit(value, depth + 1)
                elif isinstance(value, list | tuple):
                    for item in value:
                        if isinstance(item, KeyedOperator):
                            visit(item, depth + 1)

    for obj in objects:
        visit(obj, 0)
    return [found[name] for name in sorted(found)]


def _is_job_code(module: ModuleType, libraries: list[Path]) -> bool:
    name = module.__name__
    if name in ("__main__", "builtins") or name.split(".")[0] in OWN_PACKAGES:
        return False
    if name.startswith("pyspark_ckpt_"):
        return False
    file = getattr(module, "__file__", None)
    if not file:
        return False
    path = Path(file).resolve()
    return not any(path.is_relative_to(lib) for lib in libraries)


def ship_by_value(objects: Iterable[object]) -> list[str]:
    """Have cloudpickle (PySpark's) pickle the job's own modules among *objects*' classes
    by value, so the executors need not import them; returns their names. Idempotent."""
    from pyspark import cloudpickle

    modules = job_modules(objects)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    return [m.__name__ for m in modules]
