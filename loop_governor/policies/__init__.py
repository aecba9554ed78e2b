"""The policies a governed call runs through, one small object each (see loop_governor.chain)."""
