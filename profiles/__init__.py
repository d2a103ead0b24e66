"""Data the tool reads: model presets, GPU specs and shipped reference profiles."""
