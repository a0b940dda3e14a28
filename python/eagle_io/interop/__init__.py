"""Other tools' formats: SpecForge's ``.ckpt`` samples (:mod:`.specforge`) and draft vocabulary mappings
(:mod:`.vocab`, SpecForge's ``d2t``/``t2d``)."""
