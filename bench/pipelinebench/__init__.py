"""Pipeline benchmark: what exactly-once checkpointing costs a real Spark job, side by side.

The workload is the main job's (:mod:`spark_ckpt.demo`): the generator source (``ckpt-source``,
4 channels, 100k uniform keys) → the foreachBatch aligner (:meth:`Pipeline.prepare
<spark_ckpt.pipeline.pipeline.Pipeline.prepare>`, parallelism 2) running
:class:`~spark_ckpt.runtime.operator.RunningCount` → a Delta table with two-phase commit
(:class:`~spark_ckpt.delta.delta_sink.DeltaSink`), on ``local[2]``, built with the Pipeline API. One
SparkSession serves every query; every query gets a fresh temporary root (checkpoint store,
mailbox, Spark checkpoint location, output table).

A calibration query runs first (it also absorbs the Python workers' start-up): a backlog
without checkpoints; its rows per busy second is the capacity. The throughput and latency
queries are offered ``utilization`` (50%) of it as a *rate*, with no backlog.

Measurements, all in one run:

0. **The production path** — the aligner as a pipeline run builds it (pipelined),
   checkpoints every ``interval_ms`` against checkpointing off, rows per wall-clock second
   of a window of back-to-back batches (:func:`~pipelinebench.pipelined.pipelined_window`),
   repetitions in ABBA order after an unmeasured warm-up query:

   a. ``sustained`` — offered ``sustained_rate`` rows/s, no read limit (what a job that
      keeps up does);
   b. ``saturated`` — a backlog on every channel, batches of ``saturated_batch_rows``
      (``maxRowsPerTrigger``), barriers at the read position (the default placement): both
      configurations read identical batches as fast as they can, so the ratio is what
      checkpointing costs a job without spare capacity.

1. **Throughput with checkpoints vs without** (``throughput``): exactly-once aligned
   checkpoints every ``interval_ms`` (1 s) vs ``CheckpointConfig(interval_ms=None)`` (no
   checkpoint at all; the 2PC sink still encodes its output into in-progress Parquet files
   but never commits them, like Flink's file sink without checkpoints), with a
   processing-time trigger so that every batch holds the same rows in both.
   Repetitions are interleaved (each runs both configurations, in shuffled order); the ratio
   is the median of per-repetition ratios. **What is measured**: data rows handed to
   ``BatchAligner.process`` in the measured batches ÷ the sum of their Spark
   ``durationMs.triggerExecution`` (busy time: ``latestOffset`` — where the coordinator
   completes checkpoints and commits them and the sink's Delta transaction —, planning,
   ``addBatch`` = the foreachBatch call with ``toArrow``, offset and commit logs). Also
   ``ratio_from_phases``: the baseline's µs/row against baseline + the checkpoint-only work of
   the phase timers (immune to the noise of phases both share), and that work per checkpoint.
2. **Where the time goes**: every run is prepared with a
   :class:`~pipelinebench.timing.PhaseTimer` as its tracer (``Pipeline.prepare(...,
   tracer=...)``, :mod:`spark_ckpt.protocol.trace`): the engine's own spans give the exclusive
   wall time per phase of each ``foreachBatch`` call (:data:`~pipelinebench.timing.PHASES`);
   spans on other threads (the snapshot worker) are summed apart. The time outside
   ``foreachBatch`` comes from Spark's ``durationMs``. ``--profile`` adds one checkpointing
   query under cProfile (inside ``foreachBatch`` only). The source's ``read()`` work is also
   timed without Spark.
3. **Checkpoint duration** (``latency``): default trigger (batches back to back), no read
   limit; p50/p95 of ``CheckpointStats.end_to_end_ms`` of the checkpoints triggered after
   warm-up, next to the micro-batch durations (``triggerExecution``).
4. **Lagging channel, aligned vs unaligned** (``lag``): channel 0 has a backlog of ``lag``
   times its per-channel share of ``maxRowsPerTrigger``, the other channels a small one, all
   at a low rate, with ``barrierPlacement=head``. After ``lag_warmup`` batches the benchmark
   requests one checkpoint (no periodic checkpoints); its barrier is placed at every
   channel's head, so channel 0 delivers it ``lag`` micro-batches after the others.
   Reported per mode and lag: end-to-end duration, alignment time, channel-state bytes, and
   the lag observed in the batches.

Run ``python bench/pipeline.py`` (full, ~8 min) or ``--quick`` (smoke, ~2-3 min). Writes JSON
to ``bench/results/pipeline.json`` unless ``--out`` says otherwise. See ``bench/README.md``.

Modules: :mod:`~pipelinebench.settings` (workload, sizes, configurations),
:mod:`~pipelinebench.timing` (the phase timer, a ``Tracer``), :mod:`~pipelinebench.probe`
(the ``foreachBatch`` function), :mod:`~pipelinebench.query` (one query, its summary), one
module per section (:mod:`~pipelinebench.calibration`, :mod:`~pipelinebench.sustained`,
:mod:`~pipelinebench.saturated` on :mod:`~pipelinebench.pipelined`,
:mod:`~pipelinebench.throughput`, :mod:`~pipelinebench.latency`, :mod:`~pipelinebench.lag`,
:mod:`~pipelinebench.profiling`), :mod:`~pipelinebench.report` and
:mod:`~pipelinebench.main` (the command line). Shared with the other benches through
:mod:`benchcommon` only (machine and commit info, the pipeline name, ``stop_quietly``);
nothing here imports :mod:`runbench`.
"""
