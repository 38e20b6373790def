"""Sizing a job before renting GPUs: the hardware catalog, profiles (measured or analytic) and
the stage-balancing planner. The pipeline simulator is streamrl/simulation/."""
