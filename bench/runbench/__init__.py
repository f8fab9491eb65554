"""The benches of pipeline runs observed from outside: overhead, scaling, state size,
recovery, time and graphs (``bench/overhead.py``, ``bench/scaling.py``,
``bench/state_size.py``, ``bench/recovery.py``, ``bench/time.py``, ``bench/graphs.py``;
figures and commands in ``bench/README.md``).

Each bench runs a keyed job (the running count; the time bench its window and dedup
operators, next to Spark's own) the way users run a pipeline (``Pipeline.start`` /
``Pipeline.run``, the subtasks in the driver or on the executors) as a Spark streaming query,
and instruments nothing inside it: rows/s come from Spark's query progress, the cost of a
checkpoint from its statistics, memory and CPU from ``/proc``. (The pipeline benchmark,
:mod:`pipelinebench`, times the phases inside ``foreachBatch`` instead.)

Modules:

* :mod:`~runbench.variants` — the variant table: every way of running the job that the
  overhead and scaling benches compare, each started as a query on the same input;
* :mod:`~runbench.steady` — steady-state windows over the query progress, and the spread of
  repeated figures (median, bootstrap interval of paired ratios);
* :mod:`~runbench.measure` — one measured run of one variant, with what else happened meanwhile;
* :mod:`~runbench.procstat` — the processes' CPU and memory from ``/proc``, the JVM's GC;
* one module per bench, each with its settings, report and command line:
  :mod:`~runbench.overhead` (ABBA runs of separate queries) with :mod:`~runbench.alternating`
  (windows inside one query), :mod:`~runbench.scaling`, :mod:`~runbench.state_size` and
  :mod:`~runbench.recovery` (which restores the state-size bench's savepoint), and
  :mod:`~runbench.timebench` (event-time windows, timers, state TTL) with its variants
  (:mod:`~runbench.time_variants`, :mod:`~runbench.tws`, :mod:`~runbench.dedup`) and its
  arithmetic (:mod:`~runbench.timestats`), and :mod:`~runbench.graphbench` (two inputs
  joined, a one-stage graph) with its variants (:mod:`~runbench.graph_variants`).

Shared with the other benches through :mod:`benchcommon` only; nothing here imports
:mod:`pipelinebench`.
"""
