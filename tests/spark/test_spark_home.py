"""The Spark home of local JVMs (:mod:`spark_ckpt.spark.session.spark_home`): links to pip's Spark
home without ``python/lib``, built once; used only for local masters and without a user's
``SPARK_HOME``."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_ckpt.spark.session.spark_home import compiled_spark_home, local_spark_home


def _pip_home(root: Path) -> Path:
    home = root / "site-packages" / "pyspark"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (home / "jars").mkdir()
    (home / "jars" / "spark-core.jar").write_bytes(b"PK")
    (home / "python" / "lib").mkdir(parents=True)
    (home / "python" / "lib" / "pyspark.zip").write_bytes(b"PK")
    (home / "sql").mkdir()
    (home / "sql" / "__init__.py").write_text("")
    (home / "__init__.py").write_text("")
    (home / "worker.py").write_text("")
    return home


def test_the_compiled_home_links_spark_and_leaves_out_the_python_zips(tmp_path: Path) -> None:
    home = _pip_home(tmp_path)
    built = compiled_spark_home(home, tmp_path / "cache")
    assert built is not None
    assert sorted(p.name for p in built.iterdir()) == ["bin", "jars", "python"]
    assert (built / "bin").resolve() == (home / "bin").resolve()
    assert (built / "jars" / "spark-core.jar").read_bytes() == b"PK"
    assert not (built / "python" / "lib" / "pyspark.zip").exists()
    # built once: a second call finds it, new entries of the home show through the links
    (home / "jars" / "spark-sql.jar").write_bytes(b"PK")
    assert compiled_spark_home(home, tmp_path / "cache") == built
    assert (built / "jars" / "spark-sql.jar").exists()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [built.name]


def test_no_compiled_home_for_a_spark_distribution_or_an_unwritable_cache(
    tmp_path: Path,
) -> None:
    home = _pip_home(tmp_path)
    (home / "jars" / "spark-core.jar").unlink()
    (home / "jars").rmdir()
    assert compiled_spark_home(home, tmp_path / "cache") is None
    home = _pip_home(tmp_path / "b")
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert compiled_spark_home(home, blocked / "cache") is None


def test_only_local_masters_without_a_users_spark_home_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    assert local_spark_home("sc://host:15002") == {}
    assert local_spark_home("spark://host:7077") == {}
    for master in ("local[2]", "local-cluster[2,1,1024]"):
        home = Path(local_spark_home(master)["SPARK_HOME"])
        assert (home / "bin" / "spark-submit").is_file()
        assert not (home / "python" / "lib").exists()
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    assert local_spark_home("local[2]") == {}
