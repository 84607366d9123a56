"""The seed-side aggregator: watches the leases of a shoot, decides on a quorum, scales the controllers."""
