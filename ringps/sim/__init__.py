"""The simulator: predicts every strategy on a user's cluster (many workers, fast links) from a
workload profile, a cluster description and a calibrated progress model (`ringps simulate`)."""
