"""`streamrl simulate`: a run as discrete events at any scale, the product's own rollout core and
scaling round making the decisions over simulated replicas, with stage costs from the planner's
sources (streamrl/planning/)."""
