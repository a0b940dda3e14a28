"""The SGLang capture: :mod:`.scheduler` (inside SGLang's scheduler processes: hooks, control, status),
:mod:`.assembly` (one sample from a request's forwards: chunks, decode steps, retraction), :mod:`.server` (the client
of running servers over HTTP: preflight, start, submit, stop), :mod:`.client` (an in-process engine, stopped by
file), :mod:`.protocol` (what the two sides exchange), :mod:`.launch` (a capture-only server or engine)."""
