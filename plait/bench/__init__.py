"""The cross-framework benchmark behind `plait bench`."""
