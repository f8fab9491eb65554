"""Snapshots of a keyed state backend, one module per concern:
:mod:`~spark_ckpt.state.snapshot.changes` (the change log every mutation of a keyed state
records, so that a snapshot reads what changed, not the whole state),
:mod:`~spark_ckpt.state.snapshot.tables` (the Arrow tables of FULL and DELTA blobs, from a
state's entries or its change log), :mod:`~spark_ckpt.state.snapshot.chain_rules` (the shape
of a chain — one FULL blob, then DELTAs — and when a chain stops growing) and
:mod:`~spark_ckpt.state.snapshot.strategy` (``SnapshotStrategy``: full and incremental
snapshots, and the bookkeeping of pending and completed ones). Nothing is re-exported here:
import from the modules.
"""
