"""Measured GPU utilization in the pool service: its options and wiring, and the node agents whose
readings it takes."""
