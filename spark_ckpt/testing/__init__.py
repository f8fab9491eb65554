"""Testing aids: fault injection for crash and chaos tests (:mod:`spark_ckpt.testing.faults`)."""
