"""One small module per command; the logic lives in the library modules beside this package."""
