"""SAVE/LOAD measurements on the built-in decoder: the engine behind `foundry demo` and `foundry bench`."""
