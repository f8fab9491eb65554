"""``source=files``: Parquet, JSON lines or CSV files landing in a directory, read as
replayable channels. One module per concern: the options (:mod:`.files_options`, with the
``schema`` option's DDL in :mod:`.ddl_schema`), the durable listing that fixes which files
each channel holds and in what order (:mod:`.file_listing`), the three file formats
(:mod:`.file_parsing`), the read plan the executors run (:mod:`.files_read_plan`), malformed
records set aside (:mod:`.bad_records`), ``cleanSource`` (:mod:`.clean_source`), and the
channel source the source runner drives (:mod:`.files_source`). The user's guide is the
README's files section. Pure: pyarrow only (no pyspark, no deltalake).
"""
