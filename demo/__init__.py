"""``make demo``: a shoot, its seed, ten real agents behind a load balancer, an outage and the recovery."""
