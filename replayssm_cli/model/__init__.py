"""The model of the work: presets and their layer shapes, dtypes, the cost model, GPU datasheets and calibrated predictions; no torch at import."""
