"""Measuring, the bottom layer: the device (picking it, synchronising it, its peak), the clocks that time work on it,
the protocol that profiles a few iterations, memory (a step's peak tensor memory, what it holds for backward), and
the load other processes put on the machine while it measures (`load`).
Imports nothing else of gantools but `errors` and `quick`, so every layer above times work the same way."""
