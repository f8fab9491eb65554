"""The Spark home of a local JVM started with pip's pyspark: Spark's Python processes import
the installed, compiled pyspark instead of compiling ``pyspark.zip`` at every start.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on the
``PYTHONPATH`` of every Python process it starts: the daemons and workers of tasks, the
planners of Python data sources (``lookup_data_sources``, ``create_data_source``,
``plan_data_source_read``), the streaming source runner. Python cannot cache the bytecode of
modules it imports from a zip, so each of these processes compiles the pyspark modules it
imports, again and again: a compilation per process, several processes per query start
(figures: ``docs/spark-notes.md``, section 2).

With pip's pyspark, ``$SPARK_HOME`` is the installed ``pyspark`` package itself, so the zip
holds the very modules the interpreter would import from site-packages, compiled.
:func:`compiled_spark_home` builds, once per installation, a directory of symbolic links to
that Spark home (``bin``, ``jars``, ``conf``, …) without ``python/lib``; a local JVM started
with it as ``SPARK_HOME`` (:func:`local_spark_home`) gives its Python processes a
``PYTHONPATH`` whose zips do not exist, and they import pyspark and py4j from site-packages.
Nothing else changes: the same scripts and jars start the same JVM.

Only when the user set no ``SPARK_HOME`` and pyspark is pip's (it ships ``jars/``); otherwise
(a Spark distribution, a cluster, Databricks) Spark's own home is used as is. A local
cluster's executors (``local-cluster[…]``) keep their work directories under
``<compiled home>/work`` (see :func:`spark_home`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

#: Entries of the Spark home that are not linked: the zips of ``python/lib``, and ``work``
#: (a local cluster's executors write there; it belongs to the home that runs them).
_NOT_LINKED = frozenset({"python", "work", "__pycache__", "py.typed"})


def _spark_entry(entry: Path) -> bool:
    """Whether *entry* of pip's pyspark belongs to the Spark home (``bin``, ``jars``,
    ``conf``, …) rather than to the Python package (modules, sub-packages)."""
    if entry.name in _NOT_LINKED or entry.suffix in (".py", ".pyi"):
        return False
    return not (entry.is_dir() and (entry / "__init__.py").exists())


def pyspark_home() -> Path:
    """The installed pyspark package (pip's Spark home)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "spark-ckpt"


def compiled_spark_home(home: Path, cache: Path | None = None) -> Path | None:
    """A directory of symbolic links to the entries of pip's Spark home *home*, without
    ``python`` (so without ``python/lib/pyspark.zip``); built once in *cache* (default
    ``$XDG_CACHE_HOME/spark-ckpt`` or ``~/.cache/spark-ckpt``), atomically, so concurrent
    processes share it. ``None`` when *home* is no pip pyspark (no ``jars/``) or the directory
    cannot be built (the caller then uses *home* itself)."""
    if not (home / "jars").is_dir() or not (home / "bin" / "spark-submit").is_file():
        return None
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:12]
    target = (cache or _cache_dir()) / f"spark-home-v1-{digest}"
    if (target / "bin" / "spark-submit").is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=target.parent))
        try:
            for entry in sorted(filter(_spark_entry, home.iterdir())):
                (staging / entry.name).symlink_to(entry)
            (staging / "python").mkdir()  # holds no lib/: the zips Spark names do not exist
            os.rename(staging, target)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not (target / "bin" / "spark-submit").is_file():
                raise
    except OSError:
        return None
    return target


def local_spark_home(master: str) -> dict[str, str]:
    """The ``SPARK_HOME`` for a JVM this process starts for *master*: the
    :func:`compiled_spark_home` of pip's pyspark for a local master (``local``,
    ``local[N]``, ``local-cluster[…]``) when the user set no ``SPARK_HOME``; else nothing."""
    if not master.startswith("local") or os.environ.get("SPARK_HOME"):
        return {}
    home = compiled_spark_home(pyspark_home())
    return {"SPARK_HOME": str(home)} if home is not None else {}


def spark_home() -> Path:
    """The Spark home of JVMs started here: ``SPARK_HOME`` if set, else pip's pyspark's
    :func:`compiled_spark_home` (where :func:`local_spark_home` points a local JVM), else the
    installed pyspark."""
    given = os.environ.get("SPARK_HOME")
    if given:
        return Path(given)
    return compiled_spark_home(pyspark_home()) or pyspark_home()
