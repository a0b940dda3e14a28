"""The SGLang capture: :mod:`.scheduler` (inside SGLang's scheduler processes), :mod:`.client` (drives an engine),
:mod:`.protocol` (what the two exchange), :mod:`.launch` (a capture-only engine started by environment)."""
