"""Joins built on the operators over several inputs
(:mod:`spark_ckpt.runtime.co_operator`): the interval join on event time."""

from spark_ckpt.runtime.joins.interval_join import IntervalJoin, JoinType

__all__ = ["IntervalJoin", "JoinType"]
