"""Where keyed state is stored: the storage contract every state backend implements
(`table`), `hashmap` in memory (`heap`, `value_store`), `rocksdb` on the local disk
(`rocksdb`, `codecs`), and the picklable choice of one (`spec`, `state.backend.type`)."""
