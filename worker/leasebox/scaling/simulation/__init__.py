"""`leasebox simulate`: the scaling policy against HPA/KEDA-style baselines on synthetic load."""
