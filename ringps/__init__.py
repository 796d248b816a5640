"""ringps: data-parallel PyTorch training for slow networks and unequal workers.

Layers (arrows point down only): cli -> launch -> train -> strategies -> hooks -> ps -> comm
-> compress -> schedule -> cost -> data, models. See DESIGN.md for the algorithms.
"""

__version__ = "0.1.0"
