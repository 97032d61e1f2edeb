"""Baselines that need code of their own (transformers' QuantizedCache adapter); the uniform INT-n baselines are configs of harness.uniform."""
