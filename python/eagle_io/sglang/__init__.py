"""What SGLang does, in one room: everything eagle-io knows about SGLang, beneath both the SGLang capture
(:mod:`eagle_io.capturing.sglang`) and the serving guard (:mod:`eagle_io.serving`), which import it and not each
other.

* :mod:`.compat`: supported and tested versions, speculative algorithm aliases, the context-length rule;
* :mod:`.hooks`: the SGLang functions eagle-io hooks, and their check (each resolved, then verified in place);
* :mod:`.launch_args`: the launch arguments, read with SGLang's own parser when it is importable;
* :mod:`.setters`: each target's ``set_eagle3_layers_to_capture`` rule and what its forward captures;
* :mod:`.draft_build`: the draft SGLang builds from a ``config.json`` (class, ``fc``, every parameter);
* :mod:`.checkpoint`: ``config.json`` and safetensors headers of the directories SGLang loads;
* :mod:`.probe`: what eagle-io reads off SGLang's live objects in a scheduler process;
* :mod:`.servers`: JSON over HTTP to a server, and the one server launcher.

Nothing here imports SGLang at module import time, so ``eagle-io check-serving`` runs without it.
"""
