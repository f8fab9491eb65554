"""Keyed state storage: the contract (:mod:`.table`) and the state backends that implement it."""
