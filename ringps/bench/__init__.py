"""Measurements of the transport itself (`ringps bench net|comm|ps`): each module here runs as the
ranks of one measurement (`python -m ringps.bench.comm`, ...), `net` drives the emulated hosts."""
