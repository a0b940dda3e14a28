"""Other tools' formats: SpecForge's ``.ckpt`` samples (:mod:`.specforge`), vLLM speculators'
``hs_{i}.safetensors`` files (:mod:`.speculators`), draft vocabulary mappings
(:mod:`.vocab`, SpecForge's ``d2t``/``t2d``) and the ``speculation_profile.json`` kept next to a draft
(:mod:`.speculation_profile`, the shape ModelOpt proposes)."""
