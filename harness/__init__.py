"""The harness core: quantizer interface, uniform quantizers, three-region and static caches, the transformers seam, model loading, activation capture and the cell pipeline."""
