"""Hung and dead jobs: reading Flight Recorder dumps and naming the ranks the others wait for.
No torch needed: `bprof hang` runs wherever the dumps are copied to."""
