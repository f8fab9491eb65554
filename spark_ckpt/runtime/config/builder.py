"""The fluent builder of a
:class:`~spark_ckpt.runtime.config.checkpoint_config.CheckpointConfig` (Flink's Java
``CheckpointConfig`` setters)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from spark_ckpt.runtime.config.checkpoint_config import CheckpointConfig
from spark_ckpt.runtime.config.modes import CheckpointingMode, ExternalizedCheckpointRetention
from spark_ckpt.runtime.restart import RestartStrategy


class CheckpointConfigBuilder:
    """Fluent builder mirroring Flink's Java ``CheckpointConfig`` setters. Setters return the
    builder; nothing is validated until :meth:`build`, which raises :class:`ConfigError`."""

    def __init__(self, base: CheckpointConfig | None = None) -> None:
        self._config = base if base is not None else CheckpointConfig()
        self._changes: dict[str, Any] = {}

    def _set(self, **changes: Any) -> CheckpointConfigBuilder:
        self._changes.update(changes)
        return self

    def enable_checkpointing(
        self, interval_ms: int, mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE
    ) -> CheckpointConfigBuilder:
        return self._set(interval_ms=interval_ms, mode=mode)

    def disable_checkpointing(self) -> CheckpointConfigBuilder:
        return self._set(interval_ms=None)

    def set_checkpointing_mode(self, mode: CheckpointingMode) -> CheckpointConfigBuilder:
        return self._set(mode=mode)

    def set_checkpoint_timeout(self, timeout_ms: int) -> CheckpointConfigBuilder:
        return self._set(timeout_ms=timeout_ms)

    def set_min_pause_between_checkpoints(self, min_pause_ms: int) -> CheckpointConfigBuilder:
        return self._set(min_pause_ms=min_pause_ms)

    def set_max_concurrent_checkpoints(self, max_concurrent: int) -> CheckpointConfigBuilder:
        return self._set(max_concurrent=max_concurrent)

    def set_tolerable_checkpoint_failure_number(self, number: int) -> CheckpointConfigBuilder:
        return self._set(tolerable_failed_checkpoints=number)

    def enable_unaligned_checkpoints(self, enabled: bool = True) -> CheckpointConfigBuilder:
        return self._set(unaligned=enabled)

    def set_aligned_checkpoint_timeout(self, timeout_ms: int) -> CheckpointConfigBuilder:
        return self._set(aligned_checkpoint_timeout_ms=timeout_ms)

    def set_num_retained_checkpoints(self, retained: int) -> CheckpointConfigBuilder:
        return self._set(retained_checkpoints=retained)

    def set_checkpoint_history_size(self, size: int) -> CheckpointConfigBuilder:
        return self._set(history_size=size)

    def enable_externalized_checkpoints(
        self, retention: ExternalizedCheckpointRetention
    ) -> CheckpointConfigBuilder:
        return self._set(externalized_retention=retention)

    def set_checkpoint_storage(self, path: str) -> CheckpointConfigBuilder:
        return self._set(checkpoint_storage=path)

    def set_savepoint_dir(self, path: str) -> CheckpointConfigBuilder:
        return self._set(savepoint_dir=path)

    def set_restart_strategy(self, strategy: RestartStrategy) -> CheckpointConfigBuilder:
        return self._set(restart_strategy=strategy)

    def set_max_parallelism(self, max_parallelism: int) -> CheckpointConfigBuilder:
        return self._set(max_parallelism=max_parallelism)

    def build(self) -> CheckpointConfig:
        """The validated config. The builder stays usable (later setters do not affect
        configs already built)."""
        return replace(self._config, **self._changes)
