"""The generative judge: its client, the group rendezvous, the judge reward of a sample."""
