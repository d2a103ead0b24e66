"""Advice from measurements: the tuner's decision, the one-screen verdict, engine flags, the traffic plan and its rollout gate."""
