"""Other tools' formats: SpecForge's ``.ckpt`` samples (:mod:`.specforge`), vLLM speculators'
``hs_{i}.safetensors`` files (:mod:`.speculators`) and draft vocabulary mappings
(:mod:`.vocab`, SpecForge's ``d2t``/``t2d``)."""
