"""The barrier aligner's parts (:mod:`spark_ckpt.runtime.aligner` is the facade over them).

Modelled on Flink's ``SingleCheckpointBarrierHandler`` with its ``BarrierHandlerState``
implementations and on its ``CheckpointBarrierTracker``:

* :mod:`~spark_ckpt.runtime.alignment.barrier_handler` — the :class:`BarrierHandler` interface
  the facade drives (barrier, abort, end of input, timeout, routing of data rows);
* :mod:`~spark_ckpt.runtime.alignment.single_checkpoint_handler` — the exactly-once handler: one
  pending checkpoint at a time, its lifecycle a :class:`BarrierHandlerState` object;
* :mod:`~spark_ckpt.runtime.alignment.barrier_handler_state` — the states and their transitions;
* :mod:`~spark_ckpt.runtime.alignment.barrier_tracker` — the at-least-once handler;
* :mod:`~spark_ckpt.runtime.alignment.barrier_ledger` — per-channel barrier history, ended
  channels, aborted and started checkpoint ids (the protocol checks on barriers);
* :mod:`~spark_ckpt.runtime.alignment.pending_alignment` — one started checkpoint's arrivals;
* :mod:`~spark_ckpt.runtime.alignment.channel_buffer` — rows held back for blocked channels;
* :mod:`~spark_ckpt.runtime.alignment.channel_state` — in-flight rows recorded as channel state;
* :mod:`~spark_ckpt.runtime.alignment.channel_partition` — vectorized split of rows by channel;
* :mod:`~spark_ckpt.runtime.alignment.items` — input cut into data runs and control rows;
* :mod:`~spark_ckpt.runtime.alignment.admission` — schema and open-channel checks on input;
* :mod:`~spark_ckpt.runtime.alignment.step_output` — the ordered output steps;
* :mod:`~spark_ckpt.runtime.alignment.steps`, :mod:`~spark_ckpt.runtime.alignment.alignment_mode`,
  :mod:`~spark_ckpt.runtime.alignment.aligner_state` — the public value types.

Pure core: Arrow and numpy only, never ``pyspark`` or ``deltalake``.
"""
