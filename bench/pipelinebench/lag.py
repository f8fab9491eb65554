"""Section 4, ``lag``: a lagging channel, aligned vs unaligned checkpoints."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from pipelinebench.probe import Probe
from pipelinebench.query import checkpoint_dict, first_batch_ms, run_query
from pipelinebench.settings import Settings, source_options
from pipelinebench.stats import median
from spark_ckpt.coordination.messages import RequestKind
from spark_ckpt.pipeline.pipeline import Pipeline
from spark_ckpt.runtime.config import CheckpointConfig


def lag_query(spark: Any, s: Settings, mode: str, lag: int) -> dict[str, Any]:
    """One query: channel 0 delivers the barrier of the requested checkpoint *lag* batches
    after the others. Channel 0 has a backlog of *lag* times its per-channel share of
    ``maxRowsPerTrigger``, the other channels a small one, all at a low rate, with
    ``barrierPlacement=head``; after ``lag_warmup`` batches one checkpoint is requested (no
    periodic checkpoints), and its barrier is placed at every channel's head."""
    share = s.lag_batch_rows // s.channels
    # the request is posted at the end of batch lag_warmup - 1, so the latestOffset of batch
    # lag_warmup triggers it and places the barrier at every channel's head: the other
    # channels deliver it in batch lag_warmup, channel 0 (reading `share` rows per batch) in
    # batch lag_warmup + lag, as long as it grew by less than `share` rows until the trigger
    backlog0 = (s.lag_warmup + lag) * share + 1
    others = max(1, share // 4)
    config = CheckpointConfig(interval_ms=None, unaligned=mode == "unaligned")
    requested: dict[str, str] = {}

    def after_batch(pipeline: Pipeline, index: int) -> None:
        if index == s.lag_warmup - 1 and not requested:
            requested["id"] = pipeline.client.request(RequestKind.CHECKPOINT)

    def done(p: Probe) -> bool:
        return bool(requested) and any(
            c.properties.get("request_id") == requested["id"] for c in p.completed.values()
        )

    run = run_query(
        spark,
        f"lag-{mode}-{lag}",
        config,
        {
            **source_options(
                s, [backlog0] + [others] * (s.channels - 1), s.lag_rate, s.lag_batch_rows
            ),
            "barrierPlacement": "head",  # channel 0's backlog plays in-flight data
        },
        done=done,
        timeout_s=s.query_timeout_s,
        parallelism=s.parallelism,
        after_batch=after_batch,
    )
    cp = next(c for c in run.completed if c.properties.get("request_id") == requested["id"])
    arrival: dict[int, int] = {}
    for i, b in enumerate(run.probe.batches):
        for cid, channel in b.barriers:
            if cid == cp.checkpoint_id:
                arrival.setdefault(channel, i)
    observed = (
        arrival[0] - max(v for c, v in arrival.items() if c != 0)
        if 0 in arrival and len(arrival) == s.channels
        else None
    )
    first = min(arrival.values())
    last = max(arrival.values())
    window = run.probe.batches[first : last + 1]
    prog = {p["batchId"]: p for p in run.progress}
    batch_ms = [
        float(prog[b.batch_id]["durationMs"].get("triggerExecution", 0))
        for b in window
        if b.batch_id in prog
    ]
    one = checkpoint_dict(cp)
    return {
        "mode": mode,
        "lag": lag,
        "observed_lag_batches": observed,
        "checkpoint_id": one.pop("id"),
        **one,
        "start_delay_ms": cp.stats.max_start_delay_ms,
        "channel_state_bytes": cp.stats.channel_state_bytes,
        "micro_batch_ms_p50": median(batch_ms),
        "batches_from_first_to_last_barrier": last - first,
        "backlog": [backlog0] + [others] * (s.channels - 1),
        "first_batch_ms": first_batch_ms(run),
        "loadavg_start": run.loadavg_start,
        "query_wall_s": run.wall_s,
    }


def bench_lag(spark: Any, s: Settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Every (mode, lag) case ``lag_reps`` times, in shuffled order."""
    samples: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    rng = random.Random(2)
    for rep in range(s.lag_reps):
        order = [(m, lag) for lag in s.lags for m in ("aligned", "unaligned")]
        rng.shuffle(order)
        for mode, lag in order:
            r = lag_query(spark, s, mode, lag)
            samples[(mode, lag)].append(r)
            log(
                f"  rep {rep + 1}/{s.lag_reps} lag {lag:>2} {mode:<9} {r['end_to_end_ms']:>7} ms "
                f"(observed lag {r['observed_lag_batches']}, alignment {r['alignment_ms']} ms, "
                f"channel state {r['channel_state_bytes']:,} B, batch p50 "
                f"{r['micro_batch_ms_p50'] or 0:.0f} ms, load {r['loadavg_start'][0]:.1f})"
            )
    cases = []
    for (mode, lag), rs in sorted(samples.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cases.append(
            {
                "mode": mode,
                "lag": lag,
                "observed_lag_batches": [r["observed_lag_batches"] for r in rs],
                "end_to_end_ms": median([r["end_to_end_ms"] for r in rs]),
                "alignment_ms": median([r["alignment_ms"] for r in rs]),
                "channel_state_bytes": median([r["channel_state_bytes"] for r in rs]),
                "micro_batch_ms_p50": median(
                    [r["micro_batch_ms_p50"] for r in rs if r["micro_batch_ms_p50"] is not None]
                ),
                "samples": rs,
            }
        )
    return {
        "batch_rows": s.lag_batch_rows,
        "rate": s.lag_rate,
        "warmup": s.lag_warmup,
        "lags": list(s.lags),
        "reps": s.lag_reps,
        "cases": cases,
    }
