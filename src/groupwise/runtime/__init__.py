"""The machine a run is on: processes and collectives (:mod:`.distributed`), numerics
(:mod:`.precision`) and model loading, with the built-in models and the Hugging Face cache
helpers (:mod:`.models`)."""
