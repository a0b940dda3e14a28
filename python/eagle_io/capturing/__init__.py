"""Capture: hooks in the target's forward (:mod:`.hf` for Hugging Face, :mod:`.sglang` inside SGLang's schedulers)
hand each sample's aux and final hidden states to one capture core (:mod:`.store`), which copies them into the
capture ring (:mod:`.ring`) that feeds the shard writer. :mod:`.session` is the user-facing
:func:`eagle_io.capture`; :mod:`.models` loads targets. Aux-layer ids are defined in
:mod:`eagle_io.store.eagle3`, SGLang's setters in :mod:`eagle_io.sglang.setters`."""
