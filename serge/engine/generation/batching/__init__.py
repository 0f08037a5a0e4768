"""Batching: many generations of one model sharing its forward passes (the scheduler, its queue, its steps, the
sequences it runs and the threads they run on)."""
