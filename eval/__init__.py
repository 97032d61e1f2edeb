"""Evaluation tasks: each a small module whose class a task config's `_target_` names."""
