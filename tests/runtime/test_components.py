"""Naming a job's components (``module:name``) and what the hooks return by default."""

from __future__ import annotations

import pytest

from spark_ckpt.errors import ConfigError
from spark_ckpt.pipeline.job import JobSpec
from spark_ckpt.runtime.components import DEFAULT, Components, load_components
from spark_ckpt.runtime.config import CheckpointConfig
from spark_ckpt.runtime.operator import RunningCount
from spark_ckpt.spark.datasource.source_options import SourceOptions, check_pipeline_options
from spark_ckpt.storage.memory_store import InMemoryCheckpointStore


class Counting(Components):
    """A class named by a test: instantiated without arguments."""


NOT_COMPONENTS = object()


def test_no_name_is_the_pipelines_own_components() -> None:
    assert load_components(None) is DEFAULT
    assert load_components("") is DEFAULT
    store = InMemoryCheckpointStore()
    op = RunningCount("c", "user_id")
    assert DEFAULT.store(store, "/r") is store
    assert DEFAULT.operator(op, "/r") is op


def test_a_name_resolves_to_an_object_or_an_instance_of_a_class() -> None:
    from spark_ckpt.testing import faults

    assert load_components(faults.COMPONENTS) is faults.FAULTY
    assert isinstance(load_components(f"{__name__}:Counting"), Counting)


@pytest.mark.parametrize(
    "name",
    [
        "spark_ckpt.testing.faults",  # no ':'
        ":FAULTY",
        "spark_ckpt.no_such_module:X",
        "spark_ckpt.testing.faults:NO_SUCH",
        f"{__name__}:NOT_COMPONENTS",
    ],
)
def test_a_bad_name_is_a_config_error_naming_the_option(name: str) -> None:
    with pytest.raises(ConfigError, match="components"):
        load_components(name)
    with pytest.raises(ConfigError, match="components"):
        JobSpec.of({}, RunningCount("c", "user_id"), output="/tmp/out", components=name)
    with pytest.raises(ConfigError, match="components"):
        SourceOptions.parse({"pipeline": "p", "components": name})


def test_the_source_option_carries_the_name_and_users_leave_it_to_the_job() -> None:
    from spark_ckpt.testing import faults

    parsed = SourceOptions.parse({"pipeline": "p", "components": faults.COMPONENTS})
    assert parsed.components_name == faults.COMPONENTS
    assert parsed.components is faults.FAULTY
    assert SourceOptions.parse({"pipeline": "p"}).components is DEFAULT
    with pytest.raises(ConfigError, match="job's components="):
        check_pipeline_options(
            {"components": faults.COMPONENTS}, CheckpointConfig(), pipeline="p", root="/r"
        )
