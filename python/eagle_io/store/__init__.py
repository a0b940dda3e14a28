"""Storage: the schema (:mod:`.schema`) and metadata (:mod:`.metadata`) of a dataset, the writer (:mod:`.writer`) and
reader (:mod:`.reader`) over the Rust core, manifests (:mod:`.manifest`), file names and atomic writes
(:mod:`.layout`), merging ranks (:mod:`.merge`) and the independent pure-Python reader (:mod:`.reference`)."""
