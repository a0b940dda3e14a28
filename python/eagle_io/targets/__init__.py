"""Per-backend capture hooks that pull aux and final hidden states out of a target's forward.

``hf``: Hugging Face transformers, the reference path.
"""
