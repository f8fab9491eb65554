"""Deprecated since 0.2: the user's state API is :mod:`spark_ckpt.state.context`
(:class:`~spark_ckpt.state.context.StateContext`, formerly ``StateHandle``) and its views
:mod:`spark_ckpt.state.views`. Importing this module warns and re-exports them."""

from __future__ import annotations

import warnings

from spark_ckpt.state.context import StateContext
from spark_ckpt.state.views import ArrayLike, ListState, MapState, ValueState

warnings.warn(
    "spark_ckpt.state.handle is deprecated: import StateContext from spark_ckpt (or "
    "spark_ckpt.state.context) and the views from spark_ckpt.state.views",
    DeprecationWarning,
    stacklevel=2,
)

#: The former name of :class:`~spark_ckpt.state.context.StateContext`.
StateHandle = StateContext

__all__ = ["ArrayLike", "ListState", "MapState", "StateContext", "StateHandle", "ValueState"]
