"""Sizing a job before renting GPUs: the hardware catalog, profiles (measured or analytic),
the stage-balancing planner and the pipeline simulator."""
